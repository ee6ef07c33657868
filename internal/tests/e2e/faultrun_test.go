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

// faultRun is the network of the issue: a fifth of the responses dropped
// after the handler ran, a twentieth of the connections reset, a twentieth
// of the responses held past the attempt timeout.
func faultRun(windows ...faultrun.Window) faultrun.Config {
	cfg := faultrun.Config{
		Orders:         size(200, 10000),
		Callers:        size(16, 32),
		Seed:           *seed,
		Drop:           0.20,
		Reset:          0.05,
		Delay:          0.05,
		AttemptTimeout: 500 * time.Millisecond,
		StoreTimeout:   size(time.Second, 5*time.Second), // 5s is the middleware's default
		Windows:        windows,
	}
	if !*long {
		// Short waits, so that CI's run takes seconds: the client's
		// backoff and its wait on Retry-After (the middleware asks for
		// at least a second) are clamped, the store timeout shortened.
		cfg.AttemptTimeout = 300 * time.Millisecond
		cfg.ResumeAfter = 100 * time.Millisecond
		cfg.ClientOptions = []idempotency.Option{
			idempotency.WithBackoff(5*time.Millisecond, 50*time.Millisecond),
			idempotency.WithMaxRetryAfter(100 * time.Millisecond),
		}
		// A key whose Claim reached the store while its answer was
		// lost stays in flight until its lease ends: 4s rather than a
		// minute. No shorter: a response that could not be stored
		// during a store outage is stored once the store is back, and
		// that is sure to come before any retry can take the key over
		// only while the outage (2s at most here) and the store timeout
		// (1s) are shorter than the lease.
		cfg.Lease = 4 * time.Second
	}
	return cfg
}

// TestFaultRun places orders through a lossy network on every store, with a
// black hole, a cut store or a slow store for a while, and checks that every
// order ran exactly once, was confirmed to its caller once the faults
// stopped, and that the requests that met the store's fault were refused
// with 503 and ran nothing. -faultrun.long runs 10,000 orders per store.
func TestFaultRun(t *testing.T) {
	logSeed(t)
	orders := size(200, 10000)
	scenarios := []struct {
		name   string
		window faultrun.Window
	}{
		{"black hole", faultrun.Window{Fault: faultrun.Blackhole, After: orders / 4, For: size(time.Second, 3*time.Second)}},
		// Shorter than the store timeout (1s short, 5s long): a store
		// call that fails during the cut is retried until the store is
		// back, or answered 503.
		{"store cut", faultrun.Window{Fault: faultrun.StoreCut, After: orders / 4, For: size(700*time.Millisecond, 3*time.Second)}},
		// Longer than the store timeout.
		{"store cut long", faultrun.Window{Fault: faultrun.StoreCut, After: orders / 4, For: size(2*time.Second, 8*time.Second)}},
		// Slower than the store timeout, for longer than it.
		{"store slow", faultrun.Window{Fault: faultrun.StoreSlow, After: orders / 4, For: size(2500*time.Millisecond, 8*time.Second),
			Latency: size(1500*time.Millisecond, 6*time.Second)}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			for _, kind := range linkedStores() {
				t.Run(kind.name, func(t *testing.T) {
					s := kind.new(t)
					rep, err := faultrun.Run(context.Background(), s.store, s.link, faultRun(sc.window))
					require.NoError(t, err)
					t.Logf("%s, %s:\n%v", sc.name, kind.name, rep)
					assert.Empty(t, rep.Problems())
					assert.Equal(t, rep.Orders, rep.Executions, "executions")
					assert.Zero(t, rep.Duplicates, "duplicates")
					assert.Zero(t, rep.Lost, "lost")
					// The faults happened, or the run proves nothing.
					assert.Positive(t, rep.Network.Dropped, "dropped")
					assert.Positive(t, rep.Network.Reset, "reset")
					assert.Positive(t, rep.Network.Delayed, "delayed")
					require.Len(t, rep.Windows, 1)
					w := rep.Windows[0]
					switch {
					case w.Fault == faultrun.Blackhole:
						assert.Positive(t, rep.Network.Blackholed, "requests held by the black hole")
					case w.For > faultRun().StoreTimeout:
						assert.Positive(t, w.Checked, "requests that met the store's fault with every call")
						assert.Positive(t, w.Refused, "requests refused during the store's fault")
					default:
						// A cut shorter than the store timeout: a call that
						// meets it is retried until the store is back, or
						// answered 503, and either may be all there is (a
						// loaded machine gave 30 requests, 9 run after the
						// cut, none refused).
						assert.Positive(t, w.Requests, "requests during the store's fault")
						assert.Positive(t, w.Refused+w.Ran, "requests refused, or run once the store was back, during its fault")
					}
				})
			}
		})
	}
}
