package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/pgstore"
)

// Steps through PgBouncer in transaction mode, from many calls at once over
// its two server connections: in lease mode a call that fails after its
// steps is retried, and the retry replays both (a plain step, step.Run,
// and a transactional one, pgstore.RunStep, whose transaction PgBouncer
// keeps on one server connection); in transactional mode the steps and the
// order commit with the call, and a replay runs nothing. Each step runs
// once per call, and each call leaves one order. The pool is set as
// README.md asks behind a pooler in transaction mode (CacheDescribe), for
// the Store's statements and the application's own in RunStep's
// transaction alike.
func TestStepsThroughPgBouncer(t *testing.T) {
	port := startPgBouncer(t)
	direct := newPool(t)
	for _, transactional := range []bool{false, true} {
		t.Run(fmt.Sprintf("transactional=%v", transactional), func(t *testing.T) {
			ctx := testContext(t)
			_, table := newStore(t, direct)
			orders := newOrders(t, direct)
			opts := []pgstore.Option{pgstore.WithTable(table)}
			if transactional {
				opts = append(opts, pgstore.WithTransactions())
			}
			// As a pool behind PgBouncer is set for the application's own
			// statements (the orders' INSERT), which name no statement.
			pool := newPool(t, maxConns(8), func(c *pgxpool.Config) {
				c.ConnConfig.Port = uint16(port)
				c.ConnConfig.Host = "127.0.0.1"
				c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
			})
			s, err := pgstore.New(pool, opts...)
			require.NoError(t, err)
			defer s.Close()
			r := newRunner(t, s, engine.Config{})

			const workers, calls = 8, 10
			var plainRuns, orderRuns atomic.Int32
			call := func(key string, fail bool) (int64, error) {
				return once.Do(ctx, r, engine.ID{Scope: "bouncer-steps", Key: key}, "input", func(ctx context.Context) (int64, error) {
					n, err := step.Run(ctx, "plain", 1, func(context.Context) (int, error) {
						plainRuns.Add(1)
						return 7, nil
					})
					if err != nil {
						return 0, err
					}
					orderID, err := pgstore.RunStep(ctx, s, "order", n, func(ctx context.Context, tx pgx.Tx) (int64, error) {
						orderRuns.Add(1)
						return insertOrder(ctx, tx, orders, key)
					})
					if err != nil {
						return 0, err
					}
					if fail {
						return 0, errDied
					}
					return orderID, nil
				})
			}
			errs := make(chan error, workers*calls)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for c := range calls {
						key := fmt.Sprintf("k-%d-%d", w, c)
						if !transactional {
							if _, err := call(key, true); err != errDied {
								errs <- fmt.Errorf("%s, the call that fails after its steps: %v", key, err)
								continue
							}
						}
						first, err := call(key, false)
						if err != nil {
							errs <- fmt.Errorf("%s: %w", key, err)
							continue
						}
						again, err := call(key, false)
						if err != nil || again != first {
							errs <- fmt.Errorf("%s, the replay: %d, %v; want %d", key, again, err, first)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			const n = workers * calls
			assert.Equal(t, int32(n), plainRuns.Load(), "runs of the plain step")
			assert.Equal(t, int32(n), orderRuns.Load(), "runs of the transactional step")
			assert.Equal(t, n, count(t, ctx, direct, "SELECT count(*) FROM "+orders), "orders")
			assert.Equal(t, n, count(t, ctx, direct, "SELECT count(DISTINCT idem_key) FROM "+orders), "keys with an order")
		})
	}
}
