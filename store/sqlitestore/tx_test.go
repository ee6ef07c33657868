package sqlitestore_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/sqlitestore"
)

// In transactional mode the handler's writes commit with the response, or
// roll back with the claim.
func TestTransactions(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"), sqlitestore.WithTransactions())
	_, err := s.DB().Exec("CREATE TABLE orders (ref TEXT PRIMARY KEY)")
	require.NoError(t, err)
	orders := func() (n int) {
		require.NoError(t, s.DB().QueryRow("SELECT count(*) FROM orders").Scan(&n))
		return n
	}
	run := func(id engine.ID) engine.Token {
		tok := acquire(t, s, id, time.Minute)
		tx, ok := sqlitestore.TxFromContext(s.Bind(ctx, id, tok))
		require.True(t, ok, "TxFromContext in a bound context")
		_, err := tx.Exec("INSERT INTO orders (ref) VALUES (?)", id.Key)
		require.NoError(t, err)
		require.NoError(t, s.Extend(ctx, id, tok, time.Minute))
		return tok
	}
	_, ok := sqlitestore.TxFromContext(ctx)
	assert.False(t, ok, "TxFromContext outside a handler")

	kept := engine.ID{Key: "kept"}
	tok := run(kept)
	// A replay of another key does not wait for the transaction; a claim
	// that must write does, within its context.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = s.Claim(short, engine.ID{Key: "other"}, "fp", time.Minute, time.Hour)
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a claim while a transaction holds the write lock")
	require.NoError(t, s.Complete(ctx, kept, tok, created(`{"ref":"kept"}`), time.Hour))
	assert.Equal(t, 1, orders())
	c, err := s.Claim(ctx, kept, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
	assert.ErrorIs(t, s.Extend(ctx, kept, tok, time.Minute), engine.ErrLeaseLost, "Extend after Complete")

	undone := engine.ID{Key: "undone"}
	require.NoError(t, s.Release(ctx, undone, run(undone)))
	assert.Equal(t, 1, orders(), "orders after a Release")
	c, err = s.Claim(ctx, undone, "other fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status, "the key after a Release is new")
	assert.Zero(t, c.Abandoned)
	require.NoError(t, s.Release(ctx, undone, c.Token))

	// Close rolls back a transaction still open.
	path := filepath.Join(t.TempDir(), "closed.db")
	s2, err := sqlitestore.Open(ctx, path, sqlitestore.WithTransactions())
	require.NoError(t, err)
	acquire(t, s2, kept, time.Minute)
	require.NoError(t, s2.Close())
	s3 := open(t, path)
	c, err = s3.Claim(ctx, kept, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status, "the claim of a transaction rolled back by Close")
	assert.Zero(t, c.Abandoned)
}
