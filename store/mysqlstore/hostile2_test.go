package mysqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/store/mysqlstore"
)

// Every method given a done context fails at once, and changes nothing.
func TestDoneContextEveryMethod(t *testing.T) {
	ctx := context.Background()
	s := teststores.MySQL(t)
	for name, done := range doneContexts() {
		held := engine.ID{Scope: name, Key: "held"}
		c, err := s.Claim(ctx, held, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		tok := c.Token
		before, err := s.Lookup(ctx, held)
		require.NoError(t, err)
		_, err = s.Claim(done, engine.ID{Scope: name, Key: "new"}, "fp", time.Minute, time.Hour)
		assert.ErrorIs(t, err, done.Err(), "%s: Claim", name)
		assert.ErrorIs(t, s.Complete(done, held, tok, created(`{}`), time.Hour), done.Err(), "%s: Complete", name)
		assert.ErrorIs(t, s.Release(done, held, tok), done.Err(), "%s: Release", name)
		assert.ErrorIs(t, s.Extend(done, held, tok, time.Hour), done.Err(), "%s: Extend", name)
		assert.ErrorIs(t, s.SaveStep(done, held, tok, engine.Step{Name: "a", Fingerprint: "fp"}), done.Err(), "%s: SaveStep", name)
		assert.ErrorIs(t, s.SaveStep(done, held, tok, engine.Step{Name: "a"}), done.Err(), "%s: SaveStep removing", name)
		_, err = s.Lookup(done, held)
		assert.ErrorIs(t, err, done.Err(), "%s: Lookup", name)
		assert.ErrorIs(t, s.Resolve(done, held, created(`{}`), time.Hour), done.Err(), "%s: Resolve", name)
		assert.ErrorIs(t, s.Resolve(done, held, nil, time.Hour), done.Err(), "%s: Resolve nil", name)
		after, err := s.Lookup(ctx, held)
		require.NoError(t, err)
		assert.Equal(t, before, after, "%s: the record after calls with a done context", name)
		_, err = s.Lookup(ctx, engine.ID{Scope: name, Key: "new"})
		assert.ErrorIs(t, err, engine.ErrNotFound, "%s: a Claim with a done context wrote", name)
		require.NoError(t, s.Complete(ctx, held, tok, created(`{}`), time.Hour))
	}
}

// A deadline that passes while the server is slow (a proxy on loopback
// that delays every byte) ends every call soon after it, with an error; the
// record is then as it was, or wholly changed.
func TestDeadlineOnSlowServer(t *testing.T) {
	ctx := context.Background()
	direct := teststores.MySQLDB(t, false)
	table := teststores.UniqueName(t, "mysqlstore_t_")
	check := teststores.MySQLOn(t, direct, table)

	cfg, err := mysql.ParseDSN(servicetest.MySQLDSN(t))
	require.NoError(t, err)
	proxy, err := faultnet.StartTCP(cfg.Addr)
	require.NoError(t, err)
	defer proxy.Close()
	cfg.Addr = proxy.Addr()
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	defer db.Close()
	s, err := mysqlstore.New(db, mysqlstore.WithTable(table))
	require.NoError(t, err)
	defer s.Close()

	held := engine.ID{Key: "held"}
	c, err := s.Claim(ctx, held, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	tok := c.Token
	resp := created(`{"slow":1}`)

	proxy.Slow(2 * time.Second)
	for _, op := range []string{"Claim", "Extend", "SaveStep", "SaveStep removing", "Lookup", "Resolve", "Release", "Complete"} {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		start := time.Now()
		switch op {
		case "Claim":
			_, err = s.Claim(short, engine.ID{Key: "new"}, "fp", time.Minute, time.Hour)
		case "Extend":
			err = s.Extend(short, held, tok, time.Hour)
		case "SaveStep":
			err = s.SaveStep(short, held, tok, engine.Step{Name: "a", Fingerprint: "fp"})
		case "SaveStep removing": // a transaction
			err = s.SaveStep(short, held, tok, engine.Step{Name: "a"})
		case "Lookup":
			_, err = s.Lookup(short, held)
		case "Resolve":
			err = s.Resolve(short, engine.ID{Key: "absent"}, resp, time.Hour)
		case "Release":
			err = s.Release(short, engine.ID{Key: "absent"}, tok)
		case "Complete":
			err = s.Complete(short, held, tok, resp, time.Hour)
		}
		cancel()
		assert.Error(t, err, "%s on a slow server", op)
		assert.Less(t, time.Since(start), time.Second, "%s returned long after its deadline", op)
	}
	proxy.Heal()
	rec, err := check.Lookup(ctx, held)
	require.NoError(t, err, "the record after calls that timed out")
	if rec.Completed {
		assert.Equal(t, resp, rec.Response, "a Complete applied in part")
	} else {
		assert.Equal(t, tok, rec.Token)
	}
}

// Scopes and keys of every byte, at the longest length, round-trip and stay
// apart; a response of several megabytes and many headers comes back whole.
func TestOddIDsAndHugeResponse(t *testing.T) {
	ctx := context.Background()
	s := teststores.MySQL(t)
	odd := "\x00'\"\\%_;--\xff\xfe" + "é"
	pad := func(n int) string { return (strings.Repeat(odd, n/len(odd)+1))[:n] }
	ids := []engine.ID{
		{Scope: pad(engine.MaxScopeLen), Key: pad(255)},
		{Scope: pad(engine.MaxScopeLen - 1), Key: pad(255)},
		{Scope: pad(engine.MaxScopeLen), Key: pad(254)},
		{Scope: "%", Key: "_"},
		{Scope: "a", Key: "a\x00"},
		{Scope: "a\x00", Key: "a"},
		{Scope: "a", Key: "a "}, // trailing space: a PAD SPACE collation would merge it with "a"
		{Scope: "a", Key: "a"},
		{Scope: "A", Key: "a"},
		{Scope: "", Key: "' OR 1=1 --"},
	}
	header := map[string][]string{}
	for i := range 2000 {
		header[fmt.Sprintf("X-H-%d", i)] = []string{odd, strings.Repeat("v", i)}
	}
	body := bytes.Repeat([]byte("\x00\xffbody"), 1<<20) // 6 MiB
	for i, id := range ids {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status, "Claim(%q)", id)
		resp := &engine.Response{Status: 200 + i, Header: header, Body: body}
		require.NoError(t, s.Complete(ctx, id, c.Token, resp, time.Hour), "Complete(%q)", id)
	}
	for i, id := range ids {
		c, err := s.Claim(ctx, id, "other", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Completed, c.Status, "Claim(%q)", id)
		assert.Equal(t, 200+i, c.Response.Status, "Claim(%q): another ID's record", id)
		assert.Equal(t, header, c.Response.Header)
		assert.True(t, bytes.Equal(body, c.Response.Body), "body of %q", id)
	}
}
