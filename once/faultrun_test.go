package once_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
)

var (
	faultKeys = flag.Int("once.keys", 200, "keys in TestFaultRun, per store")
	faultSeed = flag.Uint64("once.seed", 1, "seed of TestFaultRun's faults")
)

// flaky is a Store whose every call may fail before it reaches the inner
// store, fail after it (the operation happened, its answer was lost), or be
// slowed, as the seed decides.
type flaky struct {
	inner engine.Store

	mu      sync.Mutex
	rng     *rand.Rand
	before  atomic.Int64
	after   atomic.Int64
	delayed atomic.Int64
}

var errFlaky = errors.New("flaky store: connection reset")

// fault decides the fate of one call: fail before, fail after, and a delay.
func (f *flaky) fault() (before, after bool, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch p := f.rng.IntN(100); {
	case p < 10:
		f.before.Add(1)
		return true, false, 0
	case p < 20:
		f.after.Add(1)
		return false, true, 0
	case p < 30:
		f.delayed.Add(1)
		return false, false, time.Duration(f.rng.IntN(20)) * time.Millisecond
	}
	return false, false, 0
}

func (f *flaky) call(ctx context.Context, op func() error) error {
	before, after, delay := f.fault()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if before {
		return errFlaky
	}
	err := op()
	if after && err == nil {
		return errFlaky
	}
	return err
}

func (f *flaky) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	var c engine.Claim
	err := f.call(ctx, func() (err error) {
		c, err = f.inner.Claim(ctx, id, fp, lease, ttl)
		return err
	})
	return c, err
}

func (f *flaky) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	return f.call(ctx, func() error { return f.inner.Complete(ctx, id, token, resp, ttl) })
}

func (f *flaky) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	return f.call(ctx, func() error { return f.inner.Release(ctx, id, token) })
}

func (f *flaky) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	return f.call(ctx, func() error { return f.inner.Extend(ctx, id, token, lease) })
}

// TestFaultRun: keys each run by two workers at once, as two consumers that
// both received a message, retrying until they get an answer, on a store
// where 10% of the calls fail, 10% lose their answer after the store
// applied them, and 10% are slowed by up to 20 ms: every key's function runs
// once, on every store. The store timeout (250 ms) is well above the
// store's own answers, so that only the injected faults fail calls: a store
// that fails every Complete for a whole lease (1 s) is the limit the
// engine documents, whose rerun is reported in Lease.Abandoned. Without the door, each worker runs it. RELIABILITY.md
// records the counts (go test ./once/ -run TestFaultRun -v).
func TestFaultRun(t *testing.T) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			store := &flaky{inner: kind.New(t), rng: rand.New(rand.NewPCG(*faultSeed, 7))}
			r := newRunner(t, store, once.WithConfig(engine.Config{Lease: time.Second, StoreTimeout: 250 * time.Millisecond, Wait: 100 * time.Millisecond, Logger: discard()}))
			run := func(door bool) (executions, dupKeys int, answers map[string]int, takeovers int) {
				var mu sync.Mutex
				effects := make(map[string]int)
				answers = make(map[string]int)
				var overs atomic.Int64
				prefix := teststores.UniqueName(t, "run-")
				var wg sync.WaitGroup
				sem := make(chan struct{}, 16)
				for k := range *faultKeys {
					key := fmt.Sprintf("%s-%d", prefix, k)
					for range 2 {
						wg.Go(func() {
							sem <- struct{}{}
							defer func() { <-sem }()
							fn := func(ctx context.Context) (string, error) {
								l, _ := engine.LeaseFromContext(ctx)
								if l.Abandoned > 0 {
									overs.Add(1)
								}
								mu.Lock()
								effects[key]++
								if door && effects[key] > 1 {
									t.Logf("%s ran again, its lease's Abandoned %d (a lost holder reported)", key, l.Abandoned)
								}
								mu.Unlock()
								return key, nil
							}
							if !door {
								v, _ := fn(context.Background())
								assert.Equal(t, key, v)
								return
							}
							for {
								v, err := once.Do(context.Background(), r, engine.ID{Scope: "faultrun", Key: key}, key, fn)
								mu.Lock()
								answers[answerOf(err)]++
								mu.Unlock()
								if err == nil {
									assert.Equal(t, key, v)
									return
								}
								var refusal *once.Error
								require.ErrorAs(t, err, &refusal)
							}
						})
					}
				}
				wg.Wait()
				for _, n := range effects {
					executions += n
					if n > 1 {
						dupKeys++
					}
				}
				return executions, dupKeys, answers, int(overs.Load())
			}

			execs, dups, answers, overs := run(true)
			t.Logf("with the door: %d keys × 2 workers: %d executions, %d keys run twice or more; answers %v; takeovers of a lost claim %d; store faults: %d failed before, %d answers lost after, %d slowed",
				*faultKeys, execs, dups, answers, overs, store.before.Load(), store.after.Load(), store.delayed.Load())
			assert.Equal(t, *faultKeys, execs, "each key's function runs once")
			assert.Zero(t, dups)

			execs, dups, _, _ = run(false)
			t.Logf("without the door: %d executions, %d keys run twice", execs, dups)
			assert.Equal(t, 2**faultKeys, execs)
		})
	}
}

func answerOf(err error) string {
	switch {
	case err == nil:
		return "value"
	case errors.Is(err, engine.ErrInFlight):
		return "in flight"
	case errors.Is(err, engine.ErrStoreUnavailable):
		return "unavailable"
	}
	return err.Error()
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
