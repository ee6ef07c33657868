package mysqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/store/mysqlstore"
)

// In transactional mode the handler's writes commit with the response, or
// roll back with the claim; a duplicate waits for the original's
// transaction, for at most a second.
func TestTransactions(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	orders := teststores.UniqueName(t, "mysqlstore_orders_")
	_, err := db.Exec("CREATE TABLE `" + orders + "` (ref VARCHAR(64) PRIMARY KEY)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + orders + "`") })
	s := teststores.MySQLOn(t, db, teststores.UniqueName(t, "mysqlstore_t_"), mysqlstore.WithTransactions())
	count := func() (n int) {
		require.NoError(t, db.QueryRow("SELECT count(*) FROM `"+orders+"`").Scan(&n))
		return n
	}
	run := func(id engine.ID) engine.Token {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status)
		tx, ok := mysqlstore.TxFromContext(s.Bind(ctx, id, c.Token))
		require.True(t, ok, "TxFromContext in a bound context")
		_, err = tx.Exec("INSERT INTO `"+orders+"` (ref) VALUES (?)", id.Key)
		require.NoError(t, err)
		require.NoError(t, s.Extend(ctx, id, c.Token, time.Minute))
		return c.Token
	}

	kept := engine.ID{Key: "kept"}
	tok := run(kept)
	start := time.Now()
	c, err := s.Claim(ctx, kept, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.InFlight, c.Status, "a duplicate while the original's transaction is open")
	assert.Equal(t, time.Second, c.RetryAfter)
	assert.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond, "the duplicate waited for the lock")
	assert.Zero(t, count(), "uncommitted orders seen from outside")
	_, err = s.Lookup(ctx, kept)
	assert.ErrorIs(t, err, engine.ErrNotFound, "Lookup of a record not committed")

	require.NoError(t, s.Complete(ctx, kept, tok, created(`{"ref":"kept"}`), time.Hour))
	assert.Equal(t, 1, count())
	c, err = s.Claim(ctx, kept, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
	assert.ErrorIs(t, s.Extend(ctx, kept, tok, time.Minute), engine.ErrLeaseLost)

	undone := engine.ID{Key: "undone"}
	require.NoError(t, s.Release(ctx, undone, run(undone)))
	assert.Equal(t, 1, count(), "orders after a Release")
	c, err = s.Claim(ctx, undone, "other fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status, "the key after a Release is new")
	require.NoError(t, s.Release(ctx, undone, c.Token))

	// The connection went back to the pool as it came.
	var wait int
	require.NoError(t, db.QueryRow("SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&wait))
	assert.NotEqual(t, 1, wait)
}
