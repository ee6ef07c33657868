package redisstore_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
	"github.com/idemkit/idempotency/store/storetest"
)

// storeACL is the ACL that the package documentation gives (ACL), for the
// default prefix: a user with these rules, and none other, runs every
// operation, Check and the replica acknowledgement included.
const storeACL = "resetkeys ~idempotency:* resetchannels -@all " +
	"+fcall +function|load +get +set +pttl +pexpire +setrange +time " +
	"+del +hset +hdel +hlen +hexists +hgetall +pexpireat +pexpiretime " +
	"+wait +config|get +info"

// aclUser makes a user with rules on p, and returns a client logged in as it.
func aclUser(t *testing.T, p *redisProcess, name, rules string) *redis.Client {
	t.Helper()
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	defer admin.Close()
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">pw-" + name}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	require.NoError(t, admin.Do(ctx, args...).Err())
	c := redis.NewClient(&redis.Options{Addr: p.Addr, Username: name, Password: "pw-" + name, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// The documented ACL is enough for every operation.
func TestDocumentedACL(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	c := aclUser(t, p, "idempotency", storeACL)
	s, err := redisstore.New(c)
	require.NoError(t, err)
	storetest.Run(t, func(*testing.T) engine.Store { return s })

	ctx := context.Background()
	id := engine.ID{Key: "acl"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	_, err = s.Lookup(ctx, id)
	require.NoError(t, err)
	require.NoError(t, s.Resolve(ctx, id, &engine.Response{Status: http.StatusOK}, time.Hour))
	assert.ErrorIs(t, s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusOK}, time.Hour), engine.ErrLeaseLost)
	assert.NoError(t, s.Check(ctx))
}

// The ACL tested above is the one that the package documentation and the
// README give, command for command.
func TestACLDocumented(t *testing.T) {
	commands := func(s string) []string {
		var out []string
		for _, f := range strings.Fields(strings.ReplaceAll(strings.ReplaceAll(s, "//", " "), `\|`, "|")) {
			if strings.HasPrefix(f, "+") {
				out = append(out, strings.Trim(f, "`"))
			}
		}
		return out
	}
	want := commands(storeACL)
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(doc), "ACL SETUSER idempotency")
	require.True(t, ok, "doc.go gives no ACL SETUSER")
	block, _, _ = strings.Cut(block, "\n//\n")
	assert.Equal(t, want, commands(block), "doc.go's ACL")
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, row, ok := strings.Cut(string(readme), "| ACL | ")
	require.True(t, ok, "README.md has no ACL row")
	row, _, _ = strings.Cut(row, " | ")
	assert.Equal(t, want, commands(row), "README.md's ACL")
}

// A user that may call the functions but not the commands they run is
// refused with NOPERM, reported as a permission error, not a corrupt record.
func TestPermissionRefused(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	for _, tc := range []struct{ name, rules string }{
		{"fcall and function load only", "resetkeys ~idempotency:* -@all +fcall +function|load"},
		{"no set", "resetkeys ~idempotency:* -@all +fcall +function|load +get +pttl +pexpire +setrange +time"},
		{"other keys", "resetkeys ~other:* -@all +fcall +function|load +get +set +pttl +pexpire +setrange +time"},
		{"no function load", "resetkeys ~idempotency:* -@all +fcall +get +set +pttl +pexpire +setrange +time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startRedis(t)
			c := aclUser(t, p, strings.ReplaceAll(tc.name, " ", "-"), tc.rules)
			s, err := redisstore.New(c)
			require.NoError(t, err)
			_, err = s.Claim(context.Background(), engine.ID{Key: tc.name}, "fp", time.Minute, time.Hour)
			require.Error(t, err)
			assert.NotErrorIs(t, err, redisstore.ErrCorruptRecord)
			var rerr redis.Error
			require.True(t, errors.As(err, &rerr), "error %v is not Redis's", err)
			// Redis 7.0 words a refusal inside a function its own way.
			assert.True(t, strings.HasPrefix(rerr.Error(), "NOPERM") ||
				strings.Contains(rerr.Error(), "can't run this command"), "Redis's error = %q, want a permission refused", rerr)
			assert.Contains(t, err.Error(), "ACL", "the error points to the documented ACL")
		})
	}
}

// A Redis without Functions (older than 7.0; here, one that renamed FCALL
// away) fails every call with an error that says which Redis is needed.
func TestRedisWithoutFunctions(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t, "--rename-command", "FCALL", "")
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	require.NoError(t, err)
	_, err = s.Claim(context.Background(), engine.ID{Key: "k"}, "fp", time.Minute, time.Hour)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Redis 7.0 or later")
}
