package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/faultrun"
)

// TestOutageAmplification is a 503 storm of 1,000 operations: the store is
// down, the middleware answers every request with 503 and Retry-After, and
// callers keep placing operations through one client. With the default
// retry budget (500 tokens, 5 a retry) the storm's operations can make at
// most 100 retries between them, instead of 3 each; once the storm ends,
// operations succeed at once. -faultrun.long honours the middleware's
// Retry-After (1s) instead of clamping it to a few milliseconds.
func TestOutageAmplification(t *testing.T) {
	const operations = 1000
	var quick []idempotency.Option
	if !*long {
		quick = []idempotency.Option{
			idempotency.WithBackoff(time.Millisecond, 5*time.Millisecond),
			idempotency.WithMaxRetryAfter(5 * time.Millisecond),
		}
	}
	callers := size(50, 100)
	for _, tc := range []struct {
		name   string
		budget int
	}{
		{"default budget", 500}, // what every Client has by default
		{"no budget", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := faultrun.Storm(context.Background(), faultrun.StormConfig{
				Operations: operations, Callers: callers, Budget: tc.budget, ClientOptions: quick,
			})
			require.NoError(t, err)
			t.Logf("%s: %d operations, %d requests, amplification %.3f; stopped: %v; %d succeeded after the storm; budget left %d",
				tc.name, rep.Operations, rep.Requests, rep.Amplification, rep.Stopped, rep.Succeeded, rep.BudgetLeft)
			t.Logf("recovery: first success %v after the storm, its last operation returned %v after; budget full after %v (%d successes); %d of the later operations failed",
				rep.FirstSuccess, rep.Drained, rep.Refilled, rep.RefillSuccesses, rep.AfterFailed)
			assert.Zero(t, rep.AfterFailed, "operations that failed after the storm")
			if tc.budget != 0 {
				// 100 retries for the storm; an operation in flight when
				// it ends may get one more from a refund.
				assert.LessOrEqual(t, rep.Requests, operations+500/5+callers)
				assert.Positive(t, rep.Stopped["retry budget exhausted"])
				assert.Positive(t, rep.RefillSuccesses, "the budget never filled up again")
			} else {
				// Four attempts each, but for those in flight when the
				// storm ended.
				assert.LessOrEqual(t, rep.Requests, 4*operations)
				assert.GreaterOrEqual(t, rep.Requests, 4*(operations-callers))
			}
		})
	}
}
