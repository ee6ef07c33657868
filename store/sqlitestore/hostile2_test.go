package sqlitestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
)

// Every method given a done context fails at once, and changes nothing.
func TestDoneContextEveryMethod(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	for name, done := range doneContexts() {
		held := engine.ID{Scope: name, Key: "held"}
		tok := acquire(t, s, held, time.Minute)
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

// A deadline that passes while another connection holds the file's write
// lock (BEGIN IMMEDIATE) ends every writing call with an error, and nothing
// is written.
func TestDeadlineWhileFileLocked(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "records.db")
	s := open(t, path)
	held := engine.ID{Key: "held"}
	tok := acquire(t, s, held, time.Minute)
	before, err := s.Lookup(ctx, held)
	require.NoError(t, err)

	other, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(1000)")
	require.NoError(t, err)
	defer other.Close()
	conn, err := other.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	require.NoError(t, err)
	defer conn.ExecContext(ctx, "ROLLBACK")

	for name, call := range map[string]func(context.Context) error{
		"Claim": func(ctx context.Context) error {
			_, err := s.Claim(ctx, engine.ID{Key: "new"}, "fp", time.Minute, time.Hour)
			return err
		},
		"Complete": func(ctx context.Context) error { return s.Complete(ctx, held, tok, created(`{}`), time.Hour) },
		"Release":  func(ctx context.Context) error { return s.Release(ctx, held, tok) },
		"Extend":   func(ctx context.Context) error { return s.Extend(ctx, held, tok, time.Hour) },
		"Resolve":  func(ctx context.Context) error { return s.Resolve(ctx, held, created(`{}`), time.Hour) },
		"SaveStep": func(ctx context.Context) error {
			return s.SaveStep(ctx, held, tok, engine.Step{Name: "a", Fingerprint: "fp"})
		},
		"SaveStep removing": func(ctx context.Context) error { // a transaction
			return s.SaveStep(ctx, held, tok, engine.Step{Name: "a"})
		},
	} {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		start := time.Now()
		err := call(short)
		cancel()
		assert.Error(t, err, "%s while the file is locked", name)
		assert.Less(t, time.Since(start), 5*time.Second, "%s returned long after its deadline", name)
	}
	_, err = conn.ExecContext(ctx, "ROLLBACK")
	require.NoError(t, err)
	after, err := s.Lookup(ctx, held)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the record after calls that timed out")
	_, err = s.Lookup(ctx, engine.ID{Key: "new"})
	assert.ErrorIs(t, err, engine.ErrNotFound)
}

// Scopes and keys of every byte, at the longest length, round-trip and stay
// apart; a response of several megabytes and many headers comes back whole.
func TestOddIDsAndHugeResponse(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	odd := "\x00'\"\\%_;--\xff\xfe" + "é"
	pad := func(n int) string { return (strings.Repeat(odd, n/len(odd)+1))[:n] }
	ids := []engine.ID{
		{Scope: pad(engine.MaxScopeLen), Key: pad(255)},
		{Scope: pad(engine.MaxScopeLen - 1), Key: pad(255)},
		{Scope: pad(engine.MaxScopeLen), Key: pad(254)},
		{Scope: "%", Key: "_"},
		{Scope: "a", Key: "a\x00"},
		{Scope: "a\x00", Key: "a"},
		{Scope: "", Key: "' OR 1=1 --"},
	}
	header := map[string][]string{}
	for i := range 2000 {
		header[fmt.Sprintf("X-H-%d", i)] = []string{odd, strings.Repeat("v", i)}
	}
	body := bytes.Repeat([]byte("\x00\xffbody"), 1<<20) // 6 MiB
	for i, id := range ids {
		tok := acquire(t, s, id, time.Minute)
		resp := &engine.Response{Status: 200 + i, Header: header, Body: body}
		require.NoError(t, s.Complete(ctx, id, tok, resp, time.Hour), "Complete(%q)", id)
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
