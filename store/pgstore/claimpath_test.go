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
)

// statementKinds records the first word of each statement a pool's
// connections send: WITH (the claim that inserts), SELECT (the read),
// INSERT.
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

// TestClaimPath: a Store reads the key in the statement that inserts while
// most claims are of new keys, and in a SELECT of its own, followed for a
// new key by the INSERT, while more than four in five claims find a record.
func TestClaimPath(t *testing.T) {
	ctx := testContext(t)
	var kinds statementKinds
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &kinds })
	s, _ := newStore(t, pool)
	kinds.take() // Migrate's
	claim := func(key string, want engine.ClaimStatus) engine.Claim {
		t.Helper()
		c, err := s.Claim(ctx, scopeID(key), "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, want, c.Status, "Claim(%s)", key)
		return c
	}
	c := claim("k0", engine.Acquired)
	assert.Equal(t, []string{"WITH"}, kinds.take(), "the first claim, of a new key")
	require.NoError(t, s.Complete(ctx, scopeID("k0"), c.Token, created(`{}`), time.Hour))
	kinds.take()
	// The new key weighed 4: four replays make up for it, and a fifth
	// tips the Store over.
	for range 5 {
		claim("k0", engine.Completed)
	}
	assert.Equal(t, []string{"WITH", "WITH", "WITH", "WITH", "WITH"}, kinds.take(), "the five replays after a new key")
	claim("k0", engine.Completed)
	assert.Equal(t, []string{"SELECT"}, kinds.take(), "a replay once most claims found a record")
	claim("k1", engine.Acquired)
	assert.Equal(t, []string{"SELECT", "INSERT"}, kinds.take(), "a new key then")
	claim("k2", engine.Acquired)
	assert.Equal(t, []string{"WITH"}, kinds.take(), "a new key after that one")
}
