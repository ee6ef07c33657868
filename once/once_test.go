package once_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/configcases"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type order struct {
	ID    int    `json:"id"`
	Item  string `json:"item"`
	Count int    `json:"count"`
}

func newRunner(t *testing.T, store engine.Store, opts ...once.Option) *once.Runner {
	t.Helper()
	r, err := once.New(store, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, r.Shutdown(ctx))
	})
	return r
}

// doneResult is what doResult returns: DoResult's value and whether it was
// replayed.
type doneResult[T any] struct {
	Value    T
	Replayed bool
}

// doResult calls once.DoResult, its answers in one value.
func doResult[T any](ctx context.Context, r *once.Runner, id engine.ID, input any, fn func(context.Context) (T, error)) (doneResult[T], error) {
	v, replayed, err := once.DoResult(ctx, r, id, input, fn)
	return doneResult[T]{Value: v, Replayed: replayed}, err
}

// eachStore runs fn on every kind of store: memory, PostgreSQL, Redis.
func eachStore(t *testing.T, fn func(t *testing.T, store engine.Store)) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) { fn(t, kind.New(t)) })
	}
}

func id(key string) engine.ID { return engine.ID{Scope: "test", Key: key} }

// TestOnce: the first call runs fn, every later one with the same input
// gets its value replayed, and one with another input is refused.
func TestOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)
		ctx := context.Background()
		var runs atomic.Int32
		place := func(ctx context.Context) (order, error) {
			n := runs.Add(1)
			return order{ID: int(n), Item: "book", Count: 2}, nil
		}
		res, err := doResult(ctx, r, id("order-1"), "book x2", place)
		require.NoError(t, err)
		assert.False(t, res.Replayed)
		assert.Equal(t, order{ID: 1, Item: "book", Count: 2}, res.Value)

		for range 3 {
			res, err = doResult(ctx, r, id("order-1"), "book x2", place)
			require.NoError(t, err)
			assert.True(t, res.Replayed)
			assert.Equal(t, order{ID: 1, Item: "book", Count: 2}, res.Value)
		}
		_, err = once.Do(ctx, r, id("order-1"), "book x3", place)
		assert.ErrorIs(t, err, engine.ErrKeyMismatch)
		var refusal *once.Error
		require.ErrorAs(t, err, &refusal)
		assert.ErrorIs(t, refusal, engine.ErrKeyMismatch)

		// Another scope is another record.
		v, err := once.Do(ctx, r, engine.ID{Scope: "other", Key: "order-1"}, "book x2", place)
		require.NoError(t, err)
		assert.Equal(t, 2, v.ID)
		assert.Equal(t, int32(2), runs.Load())
	})
}

// TestErrors: an error releases the key, so the next call runs fn again; a
// Permanent one is stored and replayed with its message.
func TestErrors(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)
		ctx := context.Background()
		errDown := errors.New("payments down")
		var runs atomic.Int32
		_, err := once.Do(ctx, r, id("pay-1"), 10, func(context.Context) (int, error) {
			runs.Add(1)
			return 0, errDown
		})
		assert.ErrorIs(t, err, errDown, "the caller that ran fn gets its error")
		v, err := once.Do(ctx, r, id("pay-1"), 10, func(context.Context) (int, error) {
			runs.Add(1)
			return 7, nil
		})
		require.NoError(t, err)
		assert.Equal(t, 7, v)
		assert.Equal(t, int32(2), runs.Load(), "a released key runs again")

		errDeclined := errors.New("card declined")
		_, err = once.Do(ctx, r, id("pay-2"), 10, func(context.Context) (int, error) {
			runs.Add(1)
			return 0, once.Permanent(errDeclined)
		})
		assert.ErrorIs(t, err, errDeclined)
		assert.ErrorIs(t, err, once.ErrPermanent)
		_, err = once.Do(ctx, r, id("pay-2"), 10, func(context.Context) (int, error) {
			runs.Add(1)
			return 1, nil
		})
		var stored *once.StoredError
		require.ErrorAs(t, err, &stored)
		assert.Equal(t, "card declined", stored.Message)
		assert.ErrorIs(t, err, once.ErrPermanent)
		assert.Equal(t, int32(3), runs.Load(), "a stored error is not run again")
	})
}

// TestConcurrentDuplicates: while fn runs, every other call with the key is
// refused as in flight (or, with a wait, gets the value): fn runs once.
func TestConcurrentDuplicates(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		const callers = 8
		ctx := context.Background()
		var runs atomic.Int32
		hold, started := make(chan struct{}), make(chan struct{})
		fn := func(context.Context) (string, error) {
			if runs.Add(1) == 1 {
				close(started)
			}
			<-hold
			return "done", nil
		}

		r := newRunner(t, store)
		first := make(chan error, 1)
		go func() {
			_, err := once.Do(ctx, r, id("job-1"), nil, fn)
			first <- err
		}()
		<-started
		var wg sync.WaitGroup
		refused := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				_, err := once.Do(ctx, r, id("job-1"), nil, fn)
				refused <- err
			})
		}
		wg.Wait()
		close(refused)
		for err := range refused {
			assert.ErrorIs(t, err, engine.ErrInFlight)
			var refusal *once.Error
			if assert.ErrorAs(t, err, &refusal) {
				assert.Positive(t, refusal.RetryAfter)
			}
		}

		// Callers that wait get the value once the holder finishes.
		waiting := newRunner(t, store, once.WithConfig(engine.Config{Wait: time.Minute}))
		values := make(chan string, callers)
		for range callers {
			wg.Go(func() {
				v, err := once.Do(ctx, waiting, id("job-1"), nil, fn)
				assert.NoError(t, err)
				values <- v
			})
		}
		close(hold)
		require.NoError(t, <-first)
		wg.Wait()
		close(values)
		for v := range values {
			assert.Equal(t, "done", v)
		}
		assert.Equal(t, int32(1), runs.Load())
	})
}

// TestStoreOutage: a store that fails every Claim, or hangs, gets an error
// wrapping ErrStoreUnavailable, and fn does not run.
func TestStoreOutage(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		for _, f := range []faultstore.Fault{
			{Err: errors.New("connection refused")},
			{ErrAfter: errors.New("answer lost")},
			{Hang: true},
		} {
			fs := faultstore.New(store)
			fs.Set(faultstore.Claim, f)
			r := newRunner(t, fs, once.WithConfig(engine.Config{StoreTimeout: 50 * time.Millisecond}))
			key := teststores.UniqueName(t, "outage-")
			ran := false
			_, err := once.Do(context.Background(), r, id(key), nil, func(context.Context) (int, error) {
				ran = true
				return 1, nil
			})
			assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
			var refusal *once.Error
			if assert.ErrorAs(t, err, &refusal) {
				assert.Positive(t, refusal.RetryAfter)
			}
			assert.False(t, ran, "fn ran unprotected")
		}
	})
}

// TestCompleteRefused: a store that takes the claim but fails every
// Complete: fn runs once, its caller gets the value, and the value is
// stored once the store answers; no call runs fn again meanwhile.
func TestCompleteRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Complete, faultstore.Fault{Err: errors.New("store down")})
		r := newRunner(t, fs, once.WithConfig(engine.Config{StoreTimeout: 50 * time.Millisecond, Lease: 5 * time.Second}))
		ctx := context.Background()
		var runs atomic.Int32
		fn := func(context.Context) (int, error) { return int(runs.Add(1)), nil }
		v, err := once.Do(ctx, r, id("late-1"), nil, fn)
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		_, err = once.Do(ctx, r, id("late-1"), nil, fn)
		assert.ErrorIs(t, err, engine.ErrInFlight, "while the value is not stored, the key stays held")

		fs.Clear(faultstore.Complete)
		for {
			res, err := doResult(ctx, r, id("late-1"), nil, fn)
			if errors.Is(err, engine.ErrInFlight) {
				pause()
				continue
			}
			require.NoError(t, err)
			assert.True(t, res.Replayed)
			assert.Equal(t, 1, res.Value)
			break
		}
		assert.Equal(t, int32(1), runs.Load())
	})
}

// TestLeaseLost: when the store cannot extend the lease, fn's context is
// cancelled with a cause that wraps ErrLeaseLost before the lease ends; the
// caller is told to retry, and the key runs again.
func TestLeaseLost(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Extend, faultstore.Fault{Err: errors.New("store down")})
		r := newRunner(t, fs, once.WithConfig(engine.Config{Lease: 300 * time.Millisecond, StoreTimeout: 50 * time.Millisecond}))
		ctx := context.Background()
		var cause error
		_, err := once.Do(ctx, r, id("lease-1"), nil, func(ctx context.Context) (int, error) {
			lease, ok := engine.LeaseFromContext(ctx)
			assert.True(t, ok)
			assert.Positive(t, lease.Token)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return 0, ctx.Err()
		})
		assert.ErrorIs(t, cause, engine.ErrLeaseLost)
		assert.ErrorIs(t, err, engine.ErrStoreUnavailable)

		fs.Clear(faultstore.Extend)
		// The release may have missed its store timeout on a busy machine
		// and be going on in the background: until it lands, the key is
		// in flight (or the short store timeout is missed again). A
		// runner with the default store timeout asks until it runs.
		r2 := newRunner(t, fs, once.WithConfig(engine.Config{Lease: 300 * time.Millisecond}))
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, err := once.Do(ctx, r2, id("lease-1"), nil, func(context.Context) (int, error) { return 2, nil })
			if (errors.Is(err, engine.ErrInFlight) || errors.Is(err, engine.ErrStoreUnavailable)) && time.Now().Before(deadline) {
				pause()
				continue
			}
			require.NoError(t, err)
			assert.Equal(t, 2, v, "the released key runs again")
			break
		}
	})
}

// TestAbandoned: a call that takes over a key whose holder was lost sees it
// in its lease; under RefuseAbandoned it gets "outcome unknown" instead,
// recorded for every later call.
func TestAbandoned(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		ctx := context.Background()
		// The fingerprint of the input nil, as the door computes it.
		r := newRunner(t, store)
		_, err := once.Do(ctx, r, id("fp-probe"), nil, func(context.Context) (int, error) { return 0, nil })
		require.NoError(t, err)
		rec, ok := store.(engine.Inspector)
		require.True(t, ok)
		probe, err := rec.Lookup(ctx, id("fp-probe"))
		require.NoError(t, err)
		abandonWith := func(key string) {
			c, err := store.Claim(ctx, id(key), probe.Fingerprint, 20*time.Millisecond, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
		}

		abandonWith("ab-1")
		var attempt int
		for {
			_, err := once.Do(ctx, r, id("ab-1"), nil, func(ctx context.Context) (int, error) {
				l, _ := engine.LeaseFromContext(ctx)
				attempt = l.Abandoned + 1
				return 1, nil
			})
			if errors.Is(err, engine.ErrInFlight) {
				pause()
				continue // the dead holder's lease has not ended yet
			}
			require.NoError(t, err)
			break
		}
		assert.Equal(t, 2, attempt, "the takeover is reported to fn")

		refuse := newRunner(t, store, once.WithConfig(engine.Config{Abandoned: engine.RefuseAbandoned}))
		abandonWith("ab-2")
		ran := false
		fn := func(context.Context) (int, error) { ran = true; return 1, nil }
		for {
			_, err = once.Do(ctx, refuse, id("ab-2"), nil, fn)
			if !errors.Is(err, engine.ErrInFlight) {
				break
			}
			pause()
		}
		assert.ErrorIs(t, err, engine.ErrOutcomeUnknown)
		_, err = once.Do(ctx, refuse, id("ab-2"), nil, fn)
		assert.ErrorIs(t, err, engine.ErrOutcomeUnknown, "recorded for every later call")
		assert.False(t, ran)
	})
}

// TestPanic: a panic in fn releases the key and goes on to the caller.
func TestPanic(t *testing.T) {
	r := newRunner(t, teststores.Memory(t))
	ctx := context.Background()
	assert.PanicsWithValue(t, "boom", func() {
		_, _ = once.Do(ctx, r, id("p-1"), nil, func(context.Context) (int, error) { panic("boom") })
	})
	v, err := once.Do(ctx, r, id("p-1"), nil, func(context.Context) (int, error) { return 3, nil })
	require.NoError(t, err)
	assert.Equal(t, 3, v)
}

// TestCallerGone: a caller whose context has ended gets its error; nothing
// runs and nothing is left claimed.
func TestCallerGone(t *testing.T) {
	r := newRunner(t, teststores.Memory(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	_, err := once.Do(ctx, r, id("g-1"), nil, func(context.Context) (int, error) { ran = true; return 1, nil })
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, ran)
	v, err := once.Do(context.Background(), r, id("g-1"), nil, func(context.Context) (int, error) { return 4, nil })
	require.NoError(t, err)
	assert.Equal(t, 4, v)
}

// TestBadInput: keys out of bounds, inputs that cannot be encoded, and
// results that cannot be are answered without surprise.
func TestBadInput(t *testing.T) {
	r := newRunner(t, teststores.Memory(t))
	ctx := context.Background()
	fn := func(context.Context) (int, error) { return 1, nil }
	for _, key := range []string{"", strings.Repeat("k", once.MaxKeyLen+1)} {
		_, err := once.Do(ctx, r, id(key), nil, fn)
		assert.ErrorIs(t, err, once.ErrInvalidKey)
	}
	_, err := once.Do(ctx, r, engine.ID{Scope: strings.Repeat("s", engine.MaxScopeLen+1), Key: "k"}, nil, fn)
	assert.ErrorIs(t, err, once.ErrInvalidKey, "a scope no store can keep is refused, not answered as an outage to retry")
	_, err = once.Do(ctx, r, id(strings.Repeat("k", once.MaxKeyLen)), nil, fn)
	assert.NoError(t, err)
	_, err = once.Do(ctx, r, id("chan"), make(chan int), fn)
	assert.ErrorContains(t, err, "once: input cannot be encoded")
	_, err = once.Do[int](ctx, r, id("nil"), nil, nil)
	assert.Error(t, err)

	// A result the codec refuses: fn ran, and it is not run again.
	runs := 0
	bad := func(context.Context) (func(), error) { runs++; return func() {}, nil }
	_, err = once.Do(ctx, r, id("bad-result"), nil, bad)
	assert.NoError(t, err)
	_, err = once.Do(ctx, r, id("bad-result"), nil, bad)
	assert.ErrorIs(t, err, engine.ErrResultOmitted)
	assert.Equal(t, 1, runs)
}

// TestOptions: every invalid option is named in one error, the engine's
// configuration with it.
func TestOptions(t *testing.T) {
	store := teststores.Memory(t)
	_, err := once.New(store, nil, once.WithConfig(engine.Config{Lease: -1, Wait: -1, Abandoned: 7}),
		once.WithKeep(nil))
	require.Error(t, err)
	for _, want := range []string{"option 0 is nil", "lease -1ns", "wait -1ns", "WithKeep", "policy 7"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = once.New(nil)
	assert.Error(t, err)
}

// TestConfigAsTheEngine: WithConfig is validated by engine.New, the same
// way in every door: a zero field is the engine's default, and an invalid
// configuration is refused with the engine's own message, after the
// package prefix.
func TestConfigAsTheEngine(t *testing.T) {
	store := teststores.Memory(t)
	for _, tc := range configcases.All() {
		t.Run(tc.Name, func(t *testing.T) {
			_, want := engine.New(store, tc.Config)
			r, err := once.New(store, once.WithConfig(tc.Config))
			if want == nil {
				require.NoError(t, err)
				require.NotNil(t, r)
				return
			}
			require.Error(t, err)
			assert.Nil(t, r)
			assert.Equal(t, "once: "+want.Error(), err.Error())
		})
	}
}

// TestCallbacksPanic: a panicking observer or store-error function changes
// nothing of the outcome.
func TestCallbacksPanic(t *testing.T) {
	r := newRunner(t, teststores.Memory(t),
		once.WithConfig(engine.Config{Observer: func(context.Context, engine.Event) { panic("observer") }}),
		once.WithKeep(func(error) bool { panic("store error") }))
	ctx := context.Background()
	runs := 0
	_, err := once.Do(ctx, r, id("cb-1"), nil, func(context.Context) (int, error) {
		runs++
		return 0, once.Permanent(errors.New("no"))
	})
	assert.ErrorIs(t, err, once.ErrPermanent)
	_, err = once.Do(ctx, r, id("cb-1"), nil, func(context.Context) (int, error) { runs++; return 0, nil })
	var stored *once.StoredError
	assert.ErrorAs(t, err, &stored, "Permanent decided when the function panicked")
	assert.Equal(t, 1, runs)
}

// TestEvents: the observer sees the door's outcomes with its statuses.
func TestEvents(t *testing.T) {
	var mu sync.Mutex
	var kinds []string
	r := newRunner(t, teststores.Memory(t), once.WithConfig(engine.Config{Observer: func(_ context.Context, e engine.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind != engine.EventAcquired {
			kinds = append(kinds, e.Kind.String()+"/"+strconv.Itoa(e.Status))
		}
	}}))
	ctx := context.Background()
	fn := func(context.Context) (int, error) { return 1, nil }
	_, _ = once.Do(ctx, r, id("ev-1"), nil, fn)
	_, _ = once.Do(ctx, r, id("ev-1"), nil, fn)
	_, _ = once.Do(ctx, r, id("ev-1"), "other", fn)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"executed/200", "replayed/200", "mismatch/422"}, kinds)
}

// pause is the wait between two polls of a condition that another
// goroutine, or the store's clock, will make true.
func pause() { time.Sleep(2 * time.Millisecond) }
