package pgstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
)

// statementKinds records the first word of each statement a pool's
// connections send: INSERT (a new key's record), SELECT (the read).
type statementKinds struct {
	mu    sync.Mutex
	kinds []string
}

func (k *statementKinds) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	first, _, _ := strings.Cut(strings.TrimSpace(d.SQL), " ")
	k.mu.Lock()
	k.kinds = append(k.kinds, first)
	k.mu.Unlock()
	return ctx
}

func (k *statementKinds) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the kinds recorded since the last take.
func (k *statementKinds) take() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	kinds := k.kinds
	k.kinds = nil
	return kinds
}

// TestClaimPath: a Store inserts first while most claims are of new keys,
// and reads the key first, in a SELECT followed for a new key by the
// INSERT, while more than one claim in three finds a record. The records
// that its claims find here were written by another Store on the table, as
// by another process: a claim of a key that this Store claimed itself goes
// another way (TestClaimPathRetry).
func TestClaimPath(t *testing.T) {
	ctx := testContext(t)
	var kinds statementKinds
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &kinds })
	s, table := newStore(t, pool)
	other, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	for _, key := range []string{"r0", "r1"} {
		tok := acquire(t, ctx, other, scopeID(key), "fp")
		require.NoError(t, other.Complete(ctx, scopeID(key), tok, created(`{}`), time.Hour))
	}
	kinds.take() // Migrate's, and the other Store's
	claim := func(key string, want engine.ClaimStatus) {
		t.Helper()
		c, err := s.Claim(ctx, scopeID(key), "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, want, c.Status, "Claim(%s)", key)
	}
	claim("k0", engine.Acquired)
	assert.Equal(t, []string{"INSERT"}, kinds.take(), "the first claim, of a new key")
	claim("r0", engine.Completed)
	assert.Equal(t, []string{"INSERT", "SELECT"}, kinds.take(), "a replay after a new key: the INSERT finds the record")
	// The new key weighed 1, the replay 2: the Store now reads first.
	claim("r1", engine.Completed)
	assert.Equal(t, []string{"SELECT"}, kinds.take(), "a replay once a third of the claims found a record")
	for _, key := range []string{"k1", "k2", "k3"} {
		claim(key, engine.Acquired)
		assert.Equal(t, []string{"SELECT", "INSERT"}, kinds.take(), "a new key then (%s)", key)
	}
	claim("k4", engine.Acquired)
	assert.Equal(t, []string{"INSERT"}, kinds.take(), "a new key once fewer than a third of the claims found a record")
}

// TestClaimPathRetry: a claim of a key that this Store claimed a moment
// ago, a retry that came back to it, reads the key first while most claims
// are of new keys, and leaves the weighing of the others as it was; a key
// it remembers whose record is gone costs a SELECT that finds nothing,
// then the INSERT, and is claimed.
func TestClaimPathRetry(t *testing.T) {
	ctx := testContext(t)
	var kinds statementKinds
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &kinds })
	s, table := newStore(t, pool)
	kinds.take() // Migrate's
	claim := func(key string, want engine.ClaimStatus) engine.Claim {
		t.Helper()
		c, err := s.Claim(ctx, scopeID(key), "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, want, c.Status, "Claim(%s)", key)
		return c
	}
	c := claim("k0", engine.Acquired)
	assert.Equal(t, []string{"INSERT"}, kinds.take(), "a new key")
	claim("k0", engine.InFlight)
	assert.Equal(t, []string{"SELECT"}, kinds.take(), "a retry while the first request runs")
	require.NoError(t, s.Complete(ctx, scopeID("k0"), c.Token, created(`{}`), time.Hour))
	kinds.take()
	for range 3 {
		claim("k0", engine.Completed)
		assert.Equal(t, []string{"SELECT"}, kinds.take(), "a retry after the first request's answer")
	}
	claim("k1", engine.Acquired)
	assert.Equal(t, []string{"INSERT"}, kinds.take(), "a new key after the retries: they weighed nothing")

	_, err := pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{table}.Sanitize()+" WHERE key = $1", []byte("k1"))
	require.NoError(t, err)
	kinds.take()
	claim("k1", engine.Acquired)
	assert.Equal(t, []string{"SELECT", "INSERT"}, kinds.take(), "a key remembered whose record is gone")
}
