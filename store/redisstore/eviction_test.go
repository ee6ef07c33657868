package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/store/redisstore"
)

// Check and Open find a Redis that may evict records, through CONFIG GET or,
// when a user may not run it, INFO memory.
func TestEvictionPolicy(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	for _, tc := range []struct {
		name     string
		args     []string
		evicting bool
	}{
		{"allkeys-lru", []string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}, true},
		{"volatile-lru", []string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"}, true},
		{"volatile-ttl", []string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-ttl"}, true},
		{"noeviction", []string{"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"}, false},
		{"no maxmemory", []string{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startRedis(t, tc.args...)
			admin := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { admin.Close() })
			users := map[string]*redis.Client{
				"CONFIG GET": admin,
				"INFO only":  aclUser(t, p, "info-only", "resetkeys ~idempotency:* -@all +fcall +function|load +get +set +pttl +pexpire +setrange +time +info"),
			}
			for name, c := range users {
				ctx := context.Background()
				s, err := redisstore.New(c)
				require.NoError(t, err)
				err = s.Check(ctx)
				if tc.evicting {
					assert.ErrorIs(t, err, redisstore.ErrEviction, name)
					assert.ErrorContains(t, err, tc.name, name)
				} else {
					assert.NoError(t, err, name)
				}

				var log bytes.Buffer
				logger := slog.New(slog.NewTextHandler(&log, nil))
				s, err = redisstore.Open(ctx, c, redisstore.WithLogger(logger))
				require.NoError(t, err, "Open, not strict")
				assert.NotNil(t, s)
				if tc.evicting {
					assert.Contains(t, log.String(), "level=ERROR", name)
					assert.Contains(t, log.String(), "noeviction", name)
				} else {
					assert.Empty(t, log.String(), name)
				}
				s, err = redisstore.Open(ctx, c, redisstore.WithLogger(logger), redisstore.WithStrictEviction())
				if tc.evicting {
					assert.ErrorIs(t, err, redisstore.ErrEviction, "strict Open, %s", name)
					assert.Nil(t, s)
				} else {
					assert.NoError(t, err, "strict Open, %s", name)
				}
			}
		})
	}

	// A user that may read neither: not evicting for all Check knows, so
	// it says it cannot tell, and a strict Open refuses.
	p := startRedis(t, "--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
	c := aclUser(t, p, "blind", "resetkeys ~idempotency:* -@all +fcall +function|load +get +set +pttl +pexpire +setrange +time")
	s, err := redisstore.New(c)
	require.NoError(t, err)
	err = s.Check(context.Background())
	require.Error(t, err)
	assert.NotErrorIs(t, err, redisstore.ErrEviction)
	_, err = redisstore.Open(context.Background(), c, redisstore.WithStrictEviction(), redisstore.WithLogger(slog.New(slog.DiscardHandler)))
	assert.Error(t, err)
}
