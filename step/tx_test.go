package step_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/pgstore"
)

// TestConcurrentStepsInTransaction: with a store in transactional mode, a
// step is recorded in the call's own transaction, on its one connection,
// which takes one statement at a time: steps run from several goroutines
// are recorded one after the other, not at once on the connection.
func TestConcurrentStepsInTransaction(t *testing.T) {
	store := teststores.Postgres(t, pgstore.WithTransactions())
	r := runner(t, store, quiet(engine.Config{}))
	const n = 20
	v, err := once.Do(context.Background(), r, engine.ID{Key: "k"}, nil, func(ctx context.Context) (int, error) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		sum := 0
		for i := range n {
			wg.Go(func() {
				v, err := step.Run(ctx, fmt.Sprint("s", i), nil, func(context.Context) (int, error) { return i, nil })
				assert.NoError(t, err)
				mu.Lock()
				sum += v
				mu.Unlock()
			})
		}
		wg.Wait()
		return sum, nil
	})
	require.NoError(t, err)
	assert.Equal(t, n*(n-1)/2, v)
}

// TestTransactionalStepsRollBack: in transactional mode a step's record is
// rolled back with a call that is released, and the retry runs the step
// again, as the package documentation says.
func TestTransactionalStepsRollBack(t *testing.T) {
	store := teststores.Postgres(t, pgstore.WithTransactions())
	r := runner(t, store, quiet(engine.Config{}))
	id := engine.ID{Key: "k"}
	var runs atomic.Int32
	work := func(fail bool) func(ctx context.Context) (int32, error) {
		return func(ctx context.Context) (int32, error) {
			v, err := step.Run(ctx, "send", nil, func(context.Context) (int32, error) { return runs.Add(1), nil })
			if err == nil && fail {
				return 0, errTransient
			}
			return v, err
		}
	}
	_, err := once.Do(context.Background(), r, id, nil, work(true))
	require.ErrorIs(t, err, errTransient)
	v, err := once.Do(context.Background(), r, id, nil, work(false))
	require.NoError(t, err)
	assert.Equal(t, int32(2), v)
}
