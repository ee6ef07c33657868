package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/pgstore"
)

// These tests run RunStep under the function door (once.Do) and the HTTP
// middleware, with a step whose effect is a row of a table without a
// unique key: a step run twice leaves two rows.

// insertOrder is a step's effect.
func insertOrder(ctx context.Context, tx pgx.Tx, orders, key string) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, "INSERT INTO "+orders+" (idem_key, amount) VALUES ($1, 100) RETURNING id", key).Scan(&id)
	return id, err
}

// quiet is the engine's logger in these tests: they lose leases and fail
// calls on purpose.
var quiet = slog.New(slog.DiscardHandler)

func newRunner(t *testing.T, s pgstore.Store, cfg engine.Config) *once.Runner {
	t.Helper()
	cfg.Logger = quiet
	r, err := once.New(s, once.WithConfig(cfg))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, r.Shutdown(ctx))
	})
	return r
}

var errDied = errors.New("the call failed after its step")

// stepEnv is a Store, in lease mode unless told, a runner on it and a table
// of orders.
type stepEnv struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	store  pgstore.Store
	table  string // the store's
	orders string
	runner *once.Runner
	// runs counts the runs of the step functions that insert orders.
	runs atomic.Int32
}

func newStepEnv(t *testing.T, cfg engine.Config, opts ...pgstore.Option) *stepEnv {
	e := &stepEnv{ctx: testContext(t), pool: newPool(t)}
	e.store, e.table = newStore(t, e.pool, opts...)
	e.orders = newOrders(t, e.pool)
	e.runner = newRunner(t, e.store, cfg)
	return e
}

// order is a step that inserts an order for key.
func (e *stepEnv) order(key string) func(context.Context, pgx.Tx) (int64, error) {
	return func(ctx context.Context, tx pgx.Tx) (int64, error) {
		e.runs.Add(1)
		return insertOrder(ctx, tx, e.orders, key)
	}
}

func (e *stepEnv) orderCount(t *testing.T, key string) int {
	t.Helper()
	return countOrders(t, e.ctx, e.pool, e.orders, key)
}

// expireLease ends the lease of the record of id, as if its holder had
// died a lease ago, and returns the record's fingerprint.
func (e *stepEnv) expireLease(t *testing.T, id engine.ID) string {
	t.Helper()
	var fp []byte
	err := e.pool.QueryRow(e.ctx, "UPDATE "+pgx.Identifier{e.table}.Sanitize()+
		" SET lease_until = statement_timestamp() - interval '1 second' WHERE scope = $1 AND key = $2 RETURNING fingerprint",
		[]byte(id.Scope), []byte(id.Key)).Scan(&fp)
	require.NoError(t, err, "expire the lease of %v", id)
	return string(fp)
}

// A call whose step committed and which then failed (its process died, in
// effect, after the step) is retried: the retry gets the step's result,
// and the step does not run again.
func TestRunStepReplaysAfterRelease(t *testing.T) {
	e := newStepEnv(t, engine.Config{})
	id := engine.ID{Scope: "steps", Key: "order-1"}
	call := func(fail bool) (int64, error) {
		return once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			orderID, err := pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key))
			if err != nil {
				return 0, err
			}
			if fail {
				return orderID, errDied
			}
			return orderID, nil
		})
	}
	_, err := call(true)
	require.ErrorIs(t, err, errDied)
	rec, err := e.store.Lookup(e.ctx, id)
	require.NoError(t, err, "the record, kept for its step")
	require.Len(t, rec.Steps, 1, "steps recorded")
	assert.True(t, rec.Steps[0].Done, "the step is done")

	got, err := call(false)
	require.NoError(t, err)
	assert.Equal(t, int32(1), e.runs.Load(), "runs of the step")
	assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
	var first int64
	require.NoError(t, e.pool.QueryRow(e.ctx, "SELECT id FROM "+e.orders+" WHERE idem_key = $1", id.Key).Scan(&first))
	assert.Equal(t, first, got, "the retry's order: the step's recorded result")
}

// The same behind the HTTP middleware: the handler answers 500 after its
// step committed; the retry resumes.
func TestRunStepBehindMiddleware(t *testing.T) {
	e := newStepEnv(t, engine.Config{})
	mw, err := server.New(e.store, server.WithConfig(engine.Config{Logger: quiet}))
	require.NoError(t, err)
	var attempts atomic.Int32
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orderID, err := pgstore.RunStep(r.Context(), e.store, "order", "amount 100", e.order("http-1"))
		if err != nil || attempts.Add(1) == 1 {
			http.Error(w, "failed after the step", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(strconv.FormatInt(orderID, 10)))
	})))
	defer srv.Close()

	status, err := post(e.ctx, srv.Client(), srv.URL, "http-1")
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, status, "first attempt")
	status, err = post(e.ctx, srv.Client(), srv.URL, "http-1")
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, status, "retry")
	assert.Equal(t, int32(1), e.runs.Load(), "runs of the step")
	assert.Equal(t, 1, e.orderCount(t, "http-1"), "orders")
}

// A holder whose step committed is lost (its lease ends: the process died,
// or hung): the call's takeover gets the step's result.
func TestRunStepReplaysAfterTakeover(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy engine.AbandonedPolicy
	}{
		{"rerun", engine.RerunAbandoned},
		{"refuse", engine.RefuseAbandoned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStepEnv(t, engine.Config{Abandoned: tc.policy})
			id := engine.ID{Scope: "steps", Key: "takeover"}
			stepped, hang := make(chan int64, 1), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
					orderID, err := pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key))
					if err != nil {
						return 0, err
					}
					stepped <- orderID
					<-hang // the holder hangs, and loses its lease
					return orderID, nil
				})
				first <- err
			}()
			var want int64
			select {
			case want = <-stepped:
			case err := <-first:
				t.Fatalf("the first call returned %v before its step", err)
			}
			e.expireLease(t, id)
			got, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
				if l, _ := engine.LeaseFromContext(ctx); l.Abandoned != 1 {
					t.Errorf("the takeover's Abandoned = %d, want 1", l.Abandoned)
				}
				return pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key))
			})
			close(hang)
			require.NoError(t, err, "the takeover")
			assert.Equal(t, want, got, "the takeover's order: the step's recorded result")
			<-first // whatever the lost holder's call answers: its Complete is refused
			assert.Equal(t, int32(1), e.runs.Load(), "runs of the step")
			assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
		})
	}
}

// A step whose function fails is rolled back and runs again: in the same
// run, under the same name, and in the retry of the call.
func TestRunStepFunctionFails(t *testing.T) {
	e := newStepEnv(t, engine.Config{})
	id := engine.ID{Scope: "steps", Key: "fails"}
	errBoom := errors.New("boom")
	failing := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		e.runs.Add(1)
		if _, err := insertOrder(ctx, tx, e.orders, id.Key); err != nil {
			return 0, err
		}
		return 7, errBoom
	}
	_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
		v, err := pgstore.RunStep(ctx, e.store, "order", 100, failing)
		assert.Equal(t, int64(7), v, "the value the failing function returned")
		return v, err
	})
	require.ErrorIs(t, err, errBoom)
	assert.Equal(t, 0, e.orderCount(t, id.Key), "orders after the failed step: rolled back")
	_, err = e.store.Lookup(e.ctx, id)
	assert.ErrorIs(t, err, engine.ErrNotFound, "the record of a call released without steps")

	got, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
		if _, err := pgstore.RunStep(ctx, e.store, "order", 100, failing); !errors.Is(err, errBoom) {
			t.Errorf("RunStep of a failing function error = %v, want it", err)
		}
		// The name is free again in this run.
		return pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key))
	})
	require.NoError(t, err)
	assert.Positive(t, got)
	assert.Equal(t, int32(3), e.runs.Load(), "runs of the step")
	assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
}

// A holder that loses its lease while its step runs: the step's record is
// refused, and its writes are rolled back with it.
func TestRunStepLeaseLostBeforeCommit(t *testing.T) {
	e := newStepEnv(t, engine.Config{}) // a lease of a minute, renewed every 20 s
	id := engine.ID{Scope: "steps", Key: "lost"}
	inserted, proceed := make(chan struct{}), make(chan struct{})
	stepErr := make(chan error, 1)
	first := make(chan error, 1)
	go func() {
		_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			v, err := pgstore.RunStep(ctx, e.store, "order", 100, func(ctx context.Context, tx pgx.Tx) (int64, error) {
				v, err := e.order(id.Key)(ctx, tx)
				close(inserted)
				<-proceed
				return v, err
			})
			stepErr <- err
			return v, err
		})
		first <- err
	}()
	select {
	case <-inserted:
	case err := <-first:
		t.Fatalf("the call returned %v before its step's insert", err)
	}
	// Another instance takes the call over once the lease has ended.
	fp := e.expireLease(t, id)
	c, err := e.store.Claim(e.ctx, id, fp, time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status, "the takeover")
	close(proceed)
	err = <-stepErr
	assert.ErrorIs(t, err, engine.ErrLeaseLost, "the lost holder's RunStep")
	assert.Error(t, <-first, "the lost holder's call")
	assert.Equal(t, 0, e.orderCount(t, id.Key), "orders: the lost holder's was rolled back")
	rec, err := e.store.Lookup(e.ctx, id)
	require.NoError(t, err)
	assert.Empty(t, rec.Steps, "steps recorded")
	assert.Equal(t, c.Token, rec.Token, "the record's holder")
}

// The step's record is written last, so that the record's row is locked
// only from then to the commit: while the function runs, the lease is
// renewed as ever.
func TestRunStepLocksRecordOnlyAtTheEnd(t *testing.T) {
	e := newStepEnv(t, engine.Config{})
	id := engine.ID{Scope: "steps", Key: "lock"}
	_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
		return pgstore.RunStep(ctx, e.store, "order", 100, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			v, err := e.order(id.Key)(ctx, tx)
			if err != nil {
				return v, err
			}
			lease, _ := engine.LeaseFromContext(ctx)
			// On another connection, which would wait for a lock the
			// step's transaction held.
			ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			return v, e.store.Extend(ectx, lease.ID, lease.Token, time.Minute)
		})
	})
	require.NoError(t, err)
	assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
}

// What RunStep refuses, without running its function.
func TestRunStepRefusals(t *testing.T) {
	e := newStepEnv(t, engine.Config{})
	never := func(context.Context, pgx.Tx) (int64, error) {
		t.Error("the step's function ran")
		return 0, nil
	}

	_, err := pgstore.RunStep(e.ctx, e.store, "order", 100, never)
	assert.ErrorIs(t, err, step.ErrNoSteps, "RunStep outside a protected call")

	t.Run("duplicate", func(t *testing.T) {
		_, err := once.Do(e.ctx, e.runner, engine.ID{Key: "duplicate"}, "input", func(ctx context.Context) (int64, error) {
			if _, err := pgstore.RunStep(ctx, e.store, "order", 100, e.order("duplicate")); err != nil {
				return 0, err
			}
			return pgstore.RunStep(ctx, e.store, "order", 100, never)
		})
		assert.ErrorContains(t, err, "already used")
		assert.True(t, strings.HasPrefix(err.Error(), "pgstore: "), "error %q lacks the package prefix", err)
	})

	t.Run("mismatch", func(t *testing.T) {
		id := engine.ID{Key: "mismatch"}
		_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			if _, err := pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key)); err != nil {
				return 0, err
			}
			return 0, errDied
		})
		require.ErrorIs(t, err, errDied)
		_, err = once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			return pgstore.RunStep(ctx, e.store, "order", 200, never)
		})
		assert.ErrorIs(t, err, engine.ErrKeyMismatch)
	})

	t.Run("context done", func(t *testing.T) {
		id := engine.ID{Key: "done"}
		_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			done, cancel := context.WithCancelCause(ctx)
			cause := errors.New("the caller left")
			cancel(cause)
			if _, err := pgstore.RunStep(done, e.store, "order", 100, never); !errors.Is(err, cause) {
				t.Errorf("RunStep on a done context error = %v, want its cause", err)
			}
			// Not run, so not used: the name runs on a live context.
			return pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key))
		})
		require.NoError(t, err)
		assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
	})

	t.Run("no function", func(t *testing.T) {
		_, err := once.Do(e.ctx, e.runner, engine.ID{Key: "nil"}, "input", func(ctx context.Context) (int64, error) {
			return pgstore.RunStep[int64](ctx, e.store, "order", 100, nil)
		})
		assert.ErrorContains(t, err, "RunStep needs a Store made by New and a function")
	})

	t.Run("owned transaction", func(t *testing.T) {
		id := engine.ID{Key: "owned"}
		_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			return pgstore.RunStep(ctx, e.store, "order", 100, func(ctx context.Context, tx pgx.Tx) (int64, error) {
				v, err := insertOrder(ctx, tx, e.orders, id.Key)
				if err != nil {
					return v, err
				}
				if err := tx.Commit(ctx); err == nil {
					t.Error("Commit of the step's transaction succeeded")
				}
				if err := tx.Rollback(ctx); err == nil {
					t.Error("Rollback of the step's transaction succeeded")
				}
				return v, nil
			})
		})
		require.NoError(t, err)
		assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
	})
}

// In transactional mode the call is one transaction: a step runs in a
// savepoint of it, and commits with the response or not at all.
func TestRunStepTransactional(t *testing.T) {
	e := newStepEnv(t, engine.Config{}, pgstore.WithTransactions())

	t.Run("released", func(t *testing.T) {
		id := engine.ID{Key: "tx-released"}
		call := func(fail bool) (int64, error) {
			return once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
				v, err := pgstore.RunStep(ctx, e.store, "order", 100, e.order(id.Key))
				if err == nil && fail {
					err = errDied
				}
				return v, err
			})
		}
		before := e.runs.Load()
		_, err := call(true)
		require.ErrorIs(t, err, errDied)
		assert.Equal(t, 0, e.orderCount(t, id.Key), "orders after a released call: rolled back with it")
		_, err = call(false)
		require.NoError(t, err)
		assert.Equal(t, int32(2), e.runs.Load()-before, "runs of the step: the released call's went")
		assert.Equal(t, 1, e.orderCount(t, id.Key), "orders")
		got, err := call(false)
		require.NoError(t, err, "the replay")
		assert.Equal(t, int32(2), e.runs.Load()-before, "runs of the step after the replay")
		assert.Positive(t, got)
	})

	t.Run("step fails, call goes on", func(t *testing.T) {
		id := engine.ID{Key: "tx-step-fails"}
		errBoom := errors.New("boom")
		_, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int64, error) {
			_, err := pgstore.RunStep(ctx, e.store, "order", 100, func(ctx context.Context, tx pgx.Tx) (int64, error) {
				if _, err := insertOrder(ctx, tx, e.orders, id.Key); err != nil {
					return 0, err
				}
				// A failed statement: without the savepoint, it would
				// abort the call's transaction.
				_, err := tx.Exec(ctx, "SELECT 1/0")
				return 0, errors.Join(errBoom, err)
			})
			if !errors.Is(err, errBoom) {
				t.Errorf("RunStep error = %v, want the function's", err)
			}
			return 1, placeOrder(ctx, e.orders, id.Key+"-handler", 100)
		})
		require.NoError(t, err)
		assert.Equal(t, 0, e.orderCount(t, id.Key), "the failed step's orders")
		assert.Equal(t, 1, e.orderCount(t, id.Key+"-handler"), "the handler's orders")
	})

	t.Run("package step", func(t *testing.T) {
		// package step records its steps with SaveStep, which must write
		// in the call's transaction: on another connection it would wait
		// for the row that the transaction holds.
		id := engine.ID{Key: "tx-package-step"}
		start := time.Now()
		got, err := once.Do(e.ctx, e.runner, id, "input", func(ctx context.Context) (int, error) {
			a, err := step.Run(ctx, "a", 1, func(context.Context) (int, error) { return 1, nil })
			if err != nil {
				return 0, err
			}
			b, err := pgstore.RunStep(ctx, e.store, "b", 2, func(context.Context, pgx.Tx) (int, error) { return 2, nil })
			return a + b, err
		})
		require.NoError(t, err)
		assert.Equal(t, 3, got)
		assert.Less(t, time.Since(start), 2*time.Second, "a call of two steps")
	})
}
