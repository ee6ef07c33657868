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

// doneContexts are a context already cancelled and one whose deadline has
// passed.
func doneContexts() map[string]context.Context {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	cancel2()
	return map[string]context.Context{"cancelled": cancelled, "past deadline": past}
}

// In transactional mode a Complete or Release whose context is already
// done fails, and still ends the lease's transaction: the key's row lock
// and the connection are not kept for a call that may never come, and a
// Complete that did not commit says so (ErrNotCommitted).
func TestTransactionDoneContext(t *testing.T) {
	ctx := context.Background()
	s := teststores.MySQLOn(t, teststores.MySQLDB(t, false), teststores.UniqueName(t, "mysqlstore_t_"), mysqlstore.WithTransactions())
	for name, done := range doneContexts() {
		for _, op := range []string{"complete", "release"} {
			id := engine.ID{Scope: name, Key: op}
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
			if op == "complete" {
				err = s.Complete(done, id, c.Token, created(`{}`), time.Hour)
				assert.ErrorIs(t, err, engine.ErrNotCommitted, "%s: Complete", name)
			} else {
				err = s.Release(done, id, c.Token)
			}
			require.Error(t, err, "%s: %s with a done context", name, op)
			assert.ErrorIs(t, err, done.Err(), "%s: %s", name, op)
			// The claim was rolled back: the key is new, at once.
			c, err = s.Claim(ctx, id, "another fp", time.Minute, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, engine.Acquired, c.Status, "%s: the key after %s with a done context", name, op)
			require.NoError(t, s.Release(ctx, id, c.Token))
		}
	}
}

// The connection of a lease's transaction killed while the handler runs:
// Complete fails with ErrNotCommitted, nothing of the handler's commits,
// and the key is new.
func TestTransactionConnectionKilled(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	orders := teststores.UniqueName(t, "mysqlstore_orders_")
	_, err := db.Exec("CREATE TABLE `" + orders + "` (ref VARCHAR(64) PRIMARY KEY)")
	require.NoError(t, err)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + orders + "`") })
	s := teststores.MySQLOn(t, db, teststores.UniqueName(t, "mysqlstore_t_"), mysqlstore.WithTransactions())
	id := engine.ID{Key: "killed"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	tx, ok := mysqlstore.TxFromContext(s.Bind(ctx, id, c.Token))
	require.True(t, ok)
	_, err = tx.Exec("INSERT INTO `" + orders + "` (ref) VALUES ('killed')")
	require.NoError(t, err)
	var conn int64
	require.NoError(t, tx.QueryRow("SELECT CONNECTION_ID()").Scan(&conn))
	_, err = db.Exec("KILL CONNECTION ?", conn)
	require.NoError(t, err)
	err = s.Complete(ctx, id, c.Token, created(`{}`), time.Hour)
	assert.ErrorIs(t, err, engine.ErrNotCommitted)
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM `"+orders+"`").Scan(&n))
	assert.Zero(t, n, "orders committed by a killed transaction")
	c, err = s.Claim(ctx, id, "another fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status, "the key after its transaction was killed")
	require.NoError(t, s.Release(ctx, id, c.Token))
}
