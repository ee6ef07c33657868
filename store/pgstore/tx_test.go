package pgstore_test

import (
	"context"
	"errors"
	"fmt"
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

// These tests play the middleware's part, which lives in package server:
// claim; when acquired, bind the lease to the handler's context, run the
// handler, then complete with its response or release on failure.

// newOrders creates the business table of the tests, dropped by t's
// cleanup, and returns its quoted name. Call it before newStore, so that the
// Store's transactions are rolled back before the drop.
func newOrders(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := uniqueName(t, "pgstore_orders_")
	_, err := pool.Exec(testContext(t), "CREATE TABLE "+pgx.Identifier{name}.Sanitize()+
		" (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount integer NOT NULL CHECK (amount > 0))")
	require.NoError(t, err)
	dropOnCleanup(t, pool, name)
	return pgx.Identifier{name}.Sanitize()
}

// placeOrder is the handler's business write, in the transaction that the
// Store bound to ctx.
func placeOrder(ctx context.Context, orders, key string, amount int) error {
	tx, ok := pgstore.TxFromContext(ctx)
	if !ok {
		return errors.New("no transaction in the handler's context")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+orders+" (idem_key, amount) VALUES ($1, $2)", key, amount)
	return err
}

func countOrders(t testing.TB, ctx context.Context, pool *pgxpool.Pool, orders, key string) int {
	t.Helper()
	return count(t, ctx, pool, "SELECT count(*) FROM "+orders+" WHERE idem_key = $1", key)
}

// outcome is what serve did.
type outcome struct {
	executed bool // the handler ran and its response was committed
	claim    engine.Claim
}

// serve runs one request as the middleware will in transactional mode.
func serve(ctx context.Context, s pgstore.Store, id engine.ID, fp string, handler func(context.Context) (*engine.Response, error)) (o outcome, err error) {
	c, err := s.Claim(ctx, id, fp, time.Minute, time.Hour)
	if err != nil || c.Status != engine.Acquired {
		return outcome{claim: c}, err
	}
	resp, err := func() (resp *engine.Response, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("handler panicked: %v", v)
			}
		}()
		return handler(s.Bind(ctx, id, c.Token))
	}()
	if err != nil {
		return outcome{claim: c}, errors.Join(err, s.Release(ctx, id, c.Token))
	}
	if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
		return outcome{claim: c}, err
	}
	return outcome{executed: true, claim: c}, nil
}

// waitForLockWaiter waits until a statement on table waits for a lock.
func waitForLockWaiter(t testing.TB, ctx context.Context, pool *pgxpool.Pool, table string) {
	t.Helper()
	eventually(t, 10*time.Second, "a Claim waiting for the key's row", func() bool {
		return count(t, ctx, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, table) > 0
	})
}

// waitForBackendGone waits until PostgreSQL has ended the backend pid, and
// with it the backend's transaction and locks.
func waitForBackendGone(t testing.TB, ctx context.Context, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	eventually(t, 10*time.Second, "the transaction's backend to end", func() bool {
		return count(t, ctx, pool, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)) == 0
	})
}

// TestTxInterrupted interrupts a request between its business write and its
// completion in every way it can be, and checks that no retry ever sees half
// of it: the order is not there, the key can be claimed again, and the retry
// that completes makes exactly one order.
func TestTxInterrupted(t *testing.T) {
	type env struct {
		pool   *pgxpool.Pool
		store  pgstore.Store
		orders string
		id     engine.ID
		token  engine.Token
		bound  context.Context // the handler's context
		ctx    context.Context // the test's, which the end of the transaction does not cancel
	}
	for _, tc := range []struct {
		name string
		opts []pgstore.Option
		// handler runs after the order was written, in the handler's
		// place, then interrupt plays the middleware's part.
		handler   func(t *testing.T, e env) (*engine.Response, error)
		interrupt func(t *testing.T, e env, resp *engine.Response, err error)
	}{
		{
			name:    "handler fails, middleware releases",
			handler: func(*testing.T, env) (*engine.Response, error) { return nil, errors.New("payment declined") },
			interrupt: func(t *testing.T, e env, _ *engine.Response, err error) {
				require.Error(t, err)
				require.NoError(t, e.store.Release(context.Background(), e.id, e.token))
			},
		},
		{
			name: "handler's context canceled during a statement",
			handler: func(t *testing.T, e env) (*engine.Response, error) {
				ctx, cancel := context.WithTimeout(e.bound, 50*time.Millisecond)
				defer cancel()
				tx, _ := pgstore.TxFromContext(ctx)
				_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
				return nil, err
			},
			interrupt: func(t *testing.T, e env, _ *engine.Response, err error) {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.NoError(t, e.store.Release(context.Background(), e.id, e.token))
			},
		},
		{
			name: "handler's context canceled, error ignored, middleware completes",
			handler: func(t *testing.T, e env) (*engine.Response, error) {
				ctx, cancel := context.WithTimeout(e.bound, 50*time.Millisecond)
				defer cancel()
				tx, _ := pgstore.TxFromContext(ctx)
				tx.Exec(ctx, "SELECT pg_sleep(10)")
				return created(`{"careless":true}`), nil
			},
			interrupt: func(t *testing.T, e env, resp *engine.Response, _ error) {
				err := e.store.Complete(context.Background(), e.id, e.token, resp, time.Hour)
				require.ErrorIs(t, err, pgstore.ErrRolledBack)
				require.ErrorIs(t, err, engine.ErrNotCommitted, "the middleware must answer 503")
			},
		},
		{
			name: "handler panics, middleware recovers and releases",
			handler: func(t *testing.T, e env) (resp *engine.Response, err error) {
				defer func() {
					if v := recover(); v != nil {
						err = fmt.Errorf("recovered: %v", v)
					}
				}()
				panic("handler bug")
			},
			interrupt: func(t *testing.T, e env, _ *engine.Response, err error) {
				require.ErrorContains(t, err, "handler bug")
				require.NoError(t, e.store.Release(context.Background(), e.id, e.token))
			},
		},
		{
			name: "backend terminated before completion",
			handler: func(t *testing.T, e env) (*engine.Response, error) {
				tx, _ := pgstore.TxFromContext(e.bound)
				pid := tx.Conn().PgConn().PID()
				_, err := e.pool.Exec(e.ctx, "SELECT pg_terminate_backend($1)", int64(pid))
				require.NoError(t, err)
				waitForBackendGone(t, e.ctx, e.pool, pid)
				return created(`{"id":1}`), nil
			},
			interrupt: func(t *testing.T, e env, resp *engine.Response, _ error) {
				err := e.store.Complete(context.Background(), e.id, e.token, resp, time.Hour)
				require.ErrorIs(t, err, pgstore.ErrRolledBack)
				require.ErrorIs(t, err, engine.ErrNotCommitted, "the middleware must answer 503")
				assert.NotErrorIs(t, err, engine.ErrLeaseLost)
			},
		},
		{
			name: "a failed statement, error ignored, middleware completes",
			handler: func(t *testing.T, e env) (*engine.Response, error) {
				// amount violates the orders table's CHECK: the
				// transaction is aborted.
				require.Error(t, placeOrder(e.bound, e.orders, e.id.Key, -1))
				return created(`{"careless":true}`), nil
			},
			interrupt: func(t *testing.T, e env, resp *engine.Response, _ error) {
				err := e.store.Complete(context.Background(), e.id, e.token, resp, time.Hour)
				require.ErrorIs(t, err, pgstore.ErrRolledBack)
				require.ErrorIs(t, err, engine.ErrNotCommitted, "the middleware must answer 503")
			},
		},
		{
			name: "transaction left idle, server ends it",
			opts: []pgstore.Option{pgstore.WithIdleTimeout(500 * time.Millisecond)},
			handler: func(t *testing.T, e env) (*engine.Response, error) {
				tx, _ := pgstore.TxFromContext(e.bound)
				waitForBackendGone(t, e.ctx, e.pool, tx.Conn().PgConn().PID())
				return created(`{"id":1}`), nil
			},
			interrupt: func(t *testing.T, e env, resp *engine.Response, _ error) {
				err := e.store.Complete(context.Background(), e.id, e.token, resp, time.Hour)
				require.ErrorIs(t, err, pgstore.ErrRolledBack)
				require.ErrorIs(t, err, engine.ErrNotCommitted, "the middleware must answer 503")
			},
		},
		{
			name:    "store closed before completion",
			handler: func(*testing.T, env) (*engine.Response, error) { return created(`{"id":1}`), nil },
			interrupt: func(t *testing.T, e env, resp *engine.Response, _ error) {
				require.NoError(t, e.store.Close())
				assert.ErrorIs(t, context.Cause(e.bound), engine.ErrLeaseLost, "the handler's context after Close")
				err := e.store.Complete(context.Background(), e.id, e.token, resp, time.Hour)
				require.ErrorIs(t, err, engine.ErrLeaseLost)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			pool := newPool(t)
			orders := newOrders(t, pool)
			s, table := newStore(t, pool, append([]pgstore.Option{pgstore.WithTransactions()}, tc.opts...)...)
			id := scopeID("order-1")

			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
			e := env{pool: pool, store: s, orders: orders, id: id, token: c.Token, bound: s.Bind(ctx, id, c.Token), ctx: ctx}
			require.NoError(t, placeOrder(e.bound, orders, id.Key, 100))
			assert.Zero(t, countOrders(t, ctx, pool, orders, id.Key), "order visible before completion")
			resp, err := tc.handler(t, e)
			tc.interrupt(t, e, resp, err)

			assert.Zero(t, countOrders(t, ctx, pool, orders, id.Key), "orders after the interruption")
			// The retry, at another instance, finds the key free and runs.
			retry, err := pgstore.New(pool, pgstore.WithTable(table), pgstore.WithTransactions())
			require.NoError(t, err)
			defer retry.Close()
			o, err := serve(ctx, retry, id, "fp", func(ctx context.Context) (*engine.Response, error) {
				return created(`{"id":1}`), placeOrder(ctx, orders, id.Key, 100)
			})
			require.NoError(t, err)
			require.True(t, o.executed, "retry status = %v, want executed", o.claim.Status)
			assert.Greater(t, o.claim.Token, c.Token, "retry's token")
			assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key), "orders after the retry")
			// And every later retry replays it.
			replay, err := retry.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Completed, replay.Status)
			assert.Equal(t, []byte(`{"id":1}`), replay.Response.Body)
			assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key), "orders after the replay")
		})
	}
}

// A duplicate that arrives while the original runs waits for its
// transaction, then replays what it committed.
func TestTxDuplicateWaitsThenReplays(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	orders := newOrders(t, pool)
	s, table := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(10*time.Second))
	id := scopeID("dup")

	tok := acquire(t, ctx, s, id, "fp")
	require.NoError(t, placeOrder(s.Bind(ctx, id, tok), orders, id.Key, 100))
	dup := claimAsync(ctx, s, id, "fp")
	waitForLockWaiter(t, ctx, pool, table)
	want := created(`{"id":7}`)
	require.NoError(t, s.Complete(ctx, id, tok, want, time.Hour))

	r := <-dup
	require.NoError(t, r.err)
	require.Equal(t, engine.Completed, r.c.Status)
	assert.Equal(t, want.Body, r.c.Response.Body)
	assert.Equal(t, want.Header, r.c.Response.Header)
	assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key))
}

// A duplicate that waits for an original that rolls back gets the key.
func TestTxDuplicateAcquiresAfterRollback(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	orders := newOrders(t, pool)
	s, table := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(10*time.Second))
	id := scopeID("dup-rollback")

	tok := acquire(t, ctx, s, id, "fp")
	require.NoError(t, placeOrder(s.Bind(ctx, id, tok), orders, id.Key, 100))
	dup := claimAsync(ctx, s, id, "fp")
	waitForLockWaiter(t, ctx, pool, table)
	require.NoError(t, s.Release(ctx, id, tok))

	r := <-dup
	require.NoError(t, r.err)
	require.Equal(t, engine.Acquired, r.c.Status)
	assert.Greater(t, r.c.Token, tok)
	require.NoError(t, placeOrder(s.Bind(ctx, id, r.c.Token), orders, id.Key, 100))
	require.NoError(t, s.Complete(ctx, id, r.c.Token, created(`{}`), time.Hour))
	assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key))
}

// A duplicate that waits longer than the lock timeout is told the request
// is in flight, and changes nothing.
func TestTxLockTimeout(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	const lockTimeout = 100 * time.Millisecond
	s, _ := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(lockTimeout))
	id := scopeID("slow")

	tok := acquire(t, ctx, s, id, "fp")
	start := time.Now()
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, engine.InFlight, c.Status)
	assert.Equal(t, lockTimeout, c.RetryAfter)
	assert.Equal(t, "fp", c.Fingerprint)
	assert.GreaterOrEqual(t, elapsed, lockTimeout, "Claim returned before the lock timeout")
	assert.Less(t, elapsed, 5*time.Second)
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour), "the original completes")
}

// A duplicate whose context ends before the lock timeout would waits for
// half the time its context has, and is told the request is in flight,
// rather than failing with its context's deadline.
func TestTxLockTimeoutWithinDeadline(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, _ := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(time.Minute))
	id := scopeID("deadline")

	tok := acquire(t, ctx, s, id, "fp")
	const timeout = 2 * time.Second
	claimCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	c, err := s.Claim(claimCtx, id, "fp", time.Minute, time.Hour)
	elapsed := time.Since(start)
	require.NoError(t, err, "Claim within its context's %v (after %v)", timeout, elapsed)
	assert.Equal(t, engine.InFlight, c.Status)
	assert.GreaterOrEqual(t, elapsed, timeout/2-10*time.Millisecond, "Claim returned before half its context's time")
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour), "the original completes")
}

// Many concurrent identical requests: one runs, every other one replays it.
func TestTxConcurrentRequests(t *testing.T) {
	ctx := testContext(t)
	const requests = 16
	pool := newPool(t, maxConns(requests+4))
	orders := newOrders(t, pool)
	s, _ := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(20*time.Second))
	for round := range 3 {
		id := scopeID(fmt.Sprintf("burst-%d", round))
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			mu       sync.Mutex
			executed int
			replayed int
		)
		for range requests {
			wg.Go(func() {
				<-start
				o, err := serve(ctx, s, id, "fp", func(ctx context.Context) (*engine.Response, error) {
					return created(`{"id":1}`), placeOrder(ctx, orders, id.Key, 100)
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("request error = %v", err)
				case o.executed:
					executed++
				case o.claim.Status == engine.Completed:
					replayed++
					assert.Equal(t, []byte(`{"id":1}`), o.claim.Response.Body)
				default:
					t.Errorf("request status = %v, want executed or replayed", o.claim.Status)
				}
			})
		}
		close(start)
		wg.Wait()
		assert.Equal(t, 1, executed, "round %d: requests executed", round)
		assert.Equal(t, requests-1, replayed, "round %d: requests replayed", round)
		assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key), "round %d: orders", round)
	}
}

func TestTxLeaseContract(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, _ := newStore(t, pool, pgstore.WithTransactions())
	id := scopeID("contract")

	tok := acquire(t, ctx, s, id, "fp")
	assert.NoError(t, s.Extend(ctx, id, tok, time.Minute), "Extend of an open lease")
	for _, stale := range []engine.Token{tok - 1, tok + 1} {
		assert.ErrorIs(t, s.Complete(ctx, id, stale, created(`{}`), time.Hour), engine.ErrLeaseLost)
		assert.ErrorIs(t, s.Release(ctx, id, stale), engine.ErrLeaseLost)
		assert.ErrorIs(t, s.Extend(ctx, id, stale, time.Minute), engine.ErrLeaseLost)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, s.Complete(canceled, id, tok, created(`{}`), time.Hour), context.Canceled)
	assert.ErrorIs(t, s.Release(canceled, id, tok), context.Canceled)
	assert.ErrorIs(t, s.Extend(canceled, id, tok, time.Minute), context.Canceled)
	_, err := s.Claim(canceled, id, "fp", time.Minute, time.Hour)
	assert.ErrorIs(t, err, context.Canceled)

	// The canceled calls left the lease open.
	require.NoError(t, s.Release(ctx, id, tok))
	assert.ErrorIs(t, s.Release(ctx, id, tok), engine.ErrLeaseLost, "second Release")
	assert.ErrorIs(t, s.Extend(ctx, id, tok, time.Minute), engine.ErrLeaseLost, "Extend after Release")
	next := acquire(t, ctx, s, id, "other")
	assert.Greater(t, next, tok)
	require.NoError(t, s.Complete(ctx, id, next, created(`{}`), time.Hour))
	assert.ErrorIs(t, s.Complete(ctx, id, next, created(`{}`), time.Hour), engine.ErrLeaseLost, "second Complete")
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
	assert.Equal(t, "other", c.Fingerprint)
}

// The handler may use the transaction, nest savepoints in it, but not end
// it.
func TestTxOwnedByStore(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	orders := newOrders(t, pool)
	s, _ := newStore(t, pool, pgstore.WithTransactions())
	id := scopeID("owned")
	tok := acquire(t, ctx, s, id, "fp")
	bound := s.Bind(ctx, id, tok)
	tx, ok := pgstore.TxFromContext(bound)
	require.True(t, ok)
	assert.Error(t, tx.Commit(ctx), "handler's Commit")
	assert.Error(t, tx.Rollback(ctx), "handler's Rollback")

	nested, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = nested.Exec(ctx, "INSERT INTO "+orders+" (idem_key, amount) VALUES ('discarded', 1)")
	require.NoError(t, err)
	require.NoError(t, nested.Rollback(ctx), "rollback to savepoint")
	require.NoError(t, placeOrder(bound, orders, id.Key, 100))
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
	assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key))
	assert.Zero(t, countOrders(t, ctx, pool, orders, "discarded"))

	_, ok = pgstore.TxFromContext(s.Bind(ctx, id, tok))
	assert.False(t, ok, "TxFromContext for a completed lease")
}

type claimResult struct {
	c   engine.Claim
	err error
}

func claimAsync(ctx context.Context, s engine.Store, id engine.ID, fp string) <-chan claimResult {
	ch := make(chan claimResult, 1)
	go func() {
		c, err := s.Claim(ctx, id, fp, time.Minute, time.Hour)
		ch <- claimResult{c, err}
	}()
	return ch
}

// A transaction that the server ended (the idle timeout, an operator):
// Extend fails with ErrLeaseLost, and the context that Bind returned is
// cancelled, with a cause that says the lease is lost. Complete says what it
// always said: the writes were rolled back.
func TestTxEndedByServer(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []pgstore.Option
		end  func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pid uint32)
	}{
		{
			name: "idle timeout",
			opts: []pgstore.Option{pgstore.WithIdleTimeout(time.Second)},
			end:  func(*testing.T, context.Context, *pgxpool.Pool, uint32) {},
		},
		{
			name: "backend terminated",
			end: func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, pid uint32) {
				_, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", int64(pid))
				require.NoError(t, err)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			pool := newPool(t)
			orders := newOrders(t, pool)
			s, _ := newStore(t, pool, append([]pgstore.Option{pgstore.WithTransactions()}, tc.opts...)...)
			id := scopeID("ended")
			tok := acquire(t, ctx, s, id, "fp")
			bound := s.Bind(ctx, id, tok)
			require.NoError(t, placeOrder(bound, orders, id.Key, 100))
			require.NoError(t, s.Extend(ctx, id, tok, time.Minute), "Extend of an open transaction")
			require.NoError(t, bound.Err(), "bound context of an open transaction")
			tx, _ := pgstore.TxFromContext(bound)
			pid := tx.Conn().PgConn().PID()

			tc.end(t, ctx, pool, pid)
			waitForBackendGone(t, ctx, pool, pid)
			assert.ErrorIs(t, s.Extend(ctx, id, tok, time.Minute), engine.ErrLeaseLost, "Extend once the transaction ended")
			select {
			case <-bound.Done():
				assert.ErrorIs(t, context.Cause(bound), engine.ErrLeaseLost, "bound context's cause")
			case <-time.After(10 * time.Second):
				t.Errorf("bound context not done 10 s after the transaction ended")
			}
			err := s.Complete(ctx, id, tok, created(`{}`), time.Hour)
			assert.ErrorIs(t, err, pgstore.ErrRolledBack)
			assert.ErrorIs(t, err, engine.ErrNotCommitted)
			assert.Zero(t, countOrders(t, ctx, pool, orders, id.Key))
		})
	}
}
