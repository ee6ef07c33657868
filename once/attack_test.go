package once_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/pgstore"
)

// untilRuns calls once.Do with fn until the answer is not ErrInFlight (the
// key is still held by a lease that has not ended), polling with a short
// pause, and returns that answer.
func untilRuns[T any](t *testing.T, r *once.Runner, key engine.ID, input any, fn func(context.Context) (T, error)) (doneResult[T], error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := doResult(context.Background(), r, key, input, fn)
		if !errors.Is(err, engine.ErrInFlight) || time.Now().After(deadline) {
			return res, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAttackReleaseFails: fn's error releases the key, but the store fails
// every Release: the caller still gets fn's error, and the key is held until
// the store takes the release, tried again in the background, then runs
// again (never replays a stale answer), with no holder counted abandoned.
func TestAttackReleaseFails(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Release, faultstore.Fault{Err: errors.New("store down")})
		r := newRunner(t, fs, once.WithConfig(engine.Config{StoreTimeout: 100 * time.Millisecond, Lease: 300 * time.Millisecond}))
		errDown := errors.New("downstream down")
		var runs atomic.Int32
		_, err := once.Do(context.Background(), r, id("rel-1"), nil, func(context.Context) (int, error) {
			runs.Add(1)
			return 0, errDown
		})
		assert.ErrorIs(t, err, errDown)
		assert.Positive(t, fs.Calls(faultstore.Release))

		fs.Clear(faultstore.Release)
		res, err := untilRuns(t, r, id("rel-1"), nil, func(ctx context.Context) (int, error) {
			l, _ := engine.LeaseFromContext(ctx)
			assert.Equal(t, 0, l.Abandoned, "the holder released once the store was back is not reported as abandoned")
			return int(runs.Add(1)), nil
		})
		require.NoError(t, err)
		assert.False(t, res.Replayed)
		assert.Equal(t, 2, res.Value)
	})
}

// TestAttackClaimAnswerLost: the store applies the Claim and its answer is
// lost: fn does not run, the caller is refused, and the key is taken over
// once the lease ends (RerunAbandoned runs fn with the takeover reported).
func TestAttackClaimAnswerLost(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Claim, faultstore.Fault{ErrAfter: errors.New("answer lost"), Times: 1})
		r := newRunner(t, fs, once.WithConfig(engine.Config{Lease: 100 * time.Millisecond}))
		var runs atomic.Int32
		fn := func(ctx context.Context) (int, error) {
			l, _ := engine.LeaseFromContext(ctx)
			assert.Equal(t, 1, l.Abandoned)
			return int(runs.Add(1)), nil
		}
		_, err := once.Do(context.Background(), r, id("lost-1"), nil, fn)
		assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
		assert.Zero(t, runs.Load())
		res, err := untilRuns(t, r, id("lost-1"), nil, fn)
		require.NoError(t, err)
		assert.Equal(t, 1, res.Value)
	})
}

// TestAttackCompleteAnswerLost: the store applies the Complete and its
// answer is lost: the caller gets fn's value, and later calls get it
// replayed; fn runs once.
func TestAttackCompleteAnswerLost(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Complete, faultstore.Fault{ErrAfter: errors.New("answer lost"), Times: 1})
		r := newRunner(t, fs, once.WithConfig(engine.Config{StoreTimeout: 200 * time.Millisecond, Lease: time.Second}))
		var runs atomic.Int32
		fn := func(context.Context) (int, error) { return int(runs.Add(1)) * 10, nil }
		v, err := once.Do(context.Background(), r, id("cal-1"), nil, fn)
		require.NoError(t, err)
		assert.Equal(t, 10, v)
		res, err := untilRuns(t, r, id("cal-1"), nil, fn)
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.Equal(t, 10, res.Value)
		assert.Equal(t, int32(1), runs.Load())
	})
}

// TestAttackCompleteHangs: every Complete hangs until its deadline: the
// caller gets fn's value after the store timeout, no other call runs fn
// while the late Complete goes on, and Shutdown returns once it gave up.
func TestAttackCompleteHangs(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Complete, faultstore.Fault{Hang: true})
		r, err := once.New(fs, once.WithConfig(engine.Config{StoreTimeout: 100 * time.Millisecond, Lease: 500 * time.Millisecond}))
		require.NoError(t, err)
		var runs atomic.Int32
		fn := func(context.Context) (int, error) { return int(runs.Add(1)), nil }
		v, err := once.Do(context.Background(), r, id("hang-1"), nil, fn)
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		_, err = once.Do(context.Background(), r, id("hang-1"), nil, fn)
		assert.ErrorIs(t, err, engine.ErrInFlight)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, r.Shutdown(ctx), "the late Complete gives up after one lease")
		assert.Equal(t, int32(1), runs.Load())
	})
}

// TestAttackShutdownGivesUp: Shutdown whose ctx ends before a hanging late
// Complete gives up returns ctx's error, and leaves no goroutine behind.
func TestAttackShutdownGivesUp(t *testing.T) {
	fs := faultstore.New(teststores.Memory(t))
	fs.Set(faultstore.Complete, faultstore.Fault{Hang: true})
	r, err := once.New(fs, once.WithConfig(engine.Config{StoreTimeout: 20 * time.Millisecond, Lease: time.Minute}))
	require.NoError(t, err)
	_, err = once.Do(context.Background(), r, id("sd-1"), nil, func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = r.Shutdown(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "once: ")
}

// slowClaim is a Store whose Claim answers only after hold, whatever its
// context says: a store that does not honour its deadline.
type slowClaim struct {
	engine.Store
	hold time.Duration
}

func (s slowClaim) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	<-time.After(s.hold)
	return c, err
}

// TestAttackClaimTooLate: a Claim answered after the lease it granted ended
// does not run fn: the caller is refused, and the key is released, so the
// next call runs fn.
func TestAttackClaimTooLate(t *testing.T) {
	const lease = 50 * time.Millisecond
	store := teststores.Memory(t)
	r := newRunner(t, slowClaim{store, lease}, once.WithConfig(engine.Config{Lease: lease}))
	ran := false
	_, err := once.Do(context.Background(), r, id("late-claim"), nil, func(context.Context) (int, error) { ran = true; return 1, nil })
	assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
	assert.False(t, ran)
	v, err := once.Do(context.Background(), newRunner(t, store), id("late-claim"), nil, func(context.Context) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.Equal(t, 2, v, "released, not left in flight")
}

// TestAttackExtremeOptions: the shortest lease and TTL, and a century of
// both, work on every store; a wait of the largest duration waits.
func TestAttackExtremeOptions(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		ctx := context.Background()
		century := 100 * 365 * 24 * time.Hour
		for name, opts := range map[string][]once.Option{
			"century":  {once.WithConfig(engine.Config{TTL: century, Lease: century})},
			"max":      {once.WithConfig(engine.Config{TTL: math.MaxInt64, Lease: math.MaxInt64, StoreTimeout: math.MaxInt64, RetryAfter: math.MaxInt64, Wait: math.MaxInt64})},
			"ttl-min":  {once.WithConfig(engine.Config{TTL: engine.MinLease, StoreTimeout: time.Second})},
			"wait-max": {once.WithConfig(engine.Config{Wait: math.MaxInt64})},
		} {
			r := newRunner(t, store, opts...)
			key := id(teststores.UniqueName(t, name+"-"))
			v, err := once.Do(ctx, r, key, name, func(context.Context) (string, error) { return name, nil })
			if name == "ttl-min" && errors.Is(err, engine.ErrStoreUnavailable) {
				continue // a 10 ms lease may be too short for this store's Claim
			}
			require.NoError(t, err, name)
			assert.Equal(t, name, v)
			if name == "ttl-min" {
				continue // the record may be gone already
			}
			res, err := doResult(ctx, r, key, name, func(context.Context) (string, error) { return "again", nil })
			require.NoError(t, err, name)
			assert.True(t, res.Replayed, name)
			assert.Equal(t, name, res.Value)
		}
	})
}

// TestAttackWaitLongest: callers waiting with the largest Wait get the
// holder's value once it returns.
func TestAttackWaitLongest(t *testing.T) {
	r := newRunner(t, teststores.Memory(t), once.WithConfig(engine.Config{Wait: math.MaxInt64}))
	hold, started := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	fn := func(context.Context) (int, error) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-hold
		return 5, nil
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		v, err := once.Do(context.Background(), r, id("wl-1"), nil, fn)
		assert.NoError(t, err)
		assert.Equal(t, 5, v)
	})
	<-started
	for range 4 {
		wg.Go(func() {
			v, err := once.Do(context.Background(), r, id("wl-1"), nil, fn)
			assert.NoError(t, err)
			assert.Equal(t, 5, v)
		})
	}
	close(hold)
	wg.Wait()
	assert.Equal(t, int32(1), runs.Load())
}

// TestAttackWaitersAfterRelease: waiting callers whose holder's fn fails
// (the key released) run fn themselves, one at a time; each of them gets an
// answer, and fn never runs twice at once.
func TestAttackWaitersAfterRelease(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		const callers = 6
		r := newRunner(t, store, once.WithConfig(engine.Config{Wait: 10 * time.Second}))
		var running, runs atomic.Int32
		errBusy := errors.New("busy")
		fn := func(context.Context) (int, error) {
			if running.Add(1) != 1 {
				t.Error("fn runs twice at once")
			}
			defer running.Add(-1)
			if runs.Add(1) < 3 {
				return 0, errBusy
			}
			return 9, nil
		}
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				v, err := once.Do(context.Background(), r, id("wr-1"), nil, fn)
				if err != nil {
					assert.ErrorIs(t, err, errBusy)
					return
				}
				assert.Equal(t, 9, v)
			})
		}
		wg.Wait()
		assert.LessOrEqual(t, runs.Load(), int32(3), "fn does not run once its value is stored")
	})
}

// TestAttackCallerCancelledDuringFn: the caller's ctx ends while fn runs.
// fn that gives up gets the key released (the next call runs it); fn that
// returns a value anyway has it stored and returned.
func TestAttackCallerCancelledDuringFn(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)

		ctx, cancel := context.WithCancel(context.Background())
		_, err := once.Do(ctx, r, id("cc-1"), nil, func(ctx context.Context) (int, error) {
			cancel()
			<-ctx.Done()
			return 0, ctx.Err()
		})
		assert.ErrorIs(t, err, context.Canceled)
		v, err := once.Do(context.Background(), r, id("cc-1"), nil, func(context.Context) (int, error) { return 2, nil })
		require.NoError(t, err, "released, not left claimed")
		assert.Equal(t, 2, v)

		ctx, cancel = context.WithCancel(context.Background())
		v, err = once.Do(ctx, r, id("cc-2"), nil, func(ctx context.Context) (int, error) {
			cancel()
			<-ctx.Done()
			return 3, nil
		})
		require.NoError(t, err, "fn's value, although the caller went away")
		assert.Equal(t, 3, v)
		res, err := doResult(context.Background(), r, id("cc-2"), nil, func(context.Context) (int, error) { return 4, nil })
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.Equal(t, 3, res.Value)

		// A permanent error returned after the caller went away is stored.
		ctx, cancel = context.WithCancel(context.Background())
		_, err = once.Do(ctx, r, id("cc-3"), nil, func(ctx context.Context) (int, error) {
			cancel()
			return 0, once.Permanent(errors.New("refused"))
		})
		assert.ErrorIs(t, err, once.ErrPermanent)
		_, err = once.Do(context.Background(), r, id("cc-3"), nil, func(context.Context) (int, error) { return 4, nil })
		var stored *once.StoredError
		require.ErrorAs(t, err, &stored)
		assert.Equal(t, "refused", stored.Message)
	})
}

// TestAttackCallerCancelledWhileWaiting: a caller waiting for the holder
// whose ctx ends gets its error at once, and does not disturb the holder.
func TestAttackCallerCancelledWhileWaiting(t *testing.T) {
	r := newRunner(t, teststores.Memory(t), once.WithConfig(engine.Config{Wait: time.Minute}))
	hold, started := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(context.Background(), r, id("cw-1"), nil, func(context.Context) (int, error) {
			close(started)
			<-hold
			return 1, nil
		})
		done <- err
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan error, 1)
	go func() {
		_, err := once.Do(ctx, r, id("cw-1"), nil, func(context.Context) (int, error) { return 2, nil })
		waiter <- err
	}()
	cancel()
	assert.ErrorIs(t, <-waiter, context.Canceled)
	close(hold)
	require.NoError(t, <-done)
	res, err := doResult(context.Background(), r, id("cw-1"), nil, func(context.Context) (int, error) { return 3, nil })
	require.NoError(t, err)
	assert.True(t, res.Replayed)
	assert.Equal(t, 1, res.Value)
}

// TestAttackPanicAfterLeaseLost: fn that panics after its lease was lost:
// the panic reaches the caller, and the key runs again afterwards.
func TestAttackPanicAfterLeaseLost(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Extend, faultstore.Fault{Err: errors.New("store down")})
		r := newRunner(t, fs, once.WithConfig(engine.Config{Lease: 300 * time.Millisecond, StoreTimeout: 50 * time.Millisecond}))
		assert.PanicsWithValue(t, "after loss", func() {
			_, _ = once.Do(context.Background(), r, id("pl-1"), nil, func(ctx context.Context) (int, error) {
				<-ctx.Done()
				panic("after loss")
			})
		})
		fs.Clear(faultstore.Extend)
		res, err := untilRuns(t, r, id("pl-1"), nil, func(context.Context) (int, error) { return 6, nil })
		require.NoError(t, err)
		assert.Equal(t, 6, res.Value)
	})
}

// panicCodec is JSON whose Marshal panics for values of type T, and whose
// Unmarshal panics when unmarshal is set.
type panicCodec[T any] struct {
	unmarshal bool
}

func (c panicCodec[T]) Marshal(v any) ([]byte, error) {
	if _, ok := v.(T); ok {
		panic("codec marshal")
	}
	return json.Marshal(v)
}

func (c panicCodec[T]) Unmarshal(data []byte, v any) error {
	if c.unmarshal {
		panic("codec unmarshal")
	}
	return json.Unmarshal(data, v)
}

type result struct{ N int }

// TestAttackCodecPanics: a Codec that panics encoding the result records
// the call as done without its value (fn ran: it must not run again); one
// that panics decoding a replay leaves the record as it was.
func TestAttackCodecPanics(t *testing.T) {
	store := teststores.Memory(t)
	r := newRunner(t, store, once.WithConfig(engine.Config{Codec: panicCodec[result]{}}))
	runs := 0
	fn := func(context.Context) (result, error) { runs++; return result{N: runs}, nil }
	v, err := once.Do(context.Background(), r, id("cp-1"), "in", fn)
	require.NoError(t, err, "the caller that ran fn gets its value")
	assert.Equal(t, result{N: 1}, v)
	good := newRunner(t, store)
	_, err = once.Do(context.Background(), good, id("cp-1"), "in", fn)
	assert.ErrorIs(t, err, engine.ErrResultOmitted)
	assert.Equal(t, 1, runs)

	v, err = once.Do(context.Background(), good, id("cp-2"), "in", fn)
	require.NoError(t, err)
	bad := newRunner(t, store, once.WithConfig(engine.Config{Codec: panicCodec[struct{}]{unmarshal: true}}))
	assert.PanicsWithValue(t, "codec unmarshal", func() { _, _ = once.Do(context.Background(), bad, id("cp-2"), "in", fn) })
	res, err := doResult(context.Background(), good, id("cp-2"), "in", fn)
	require.NoError(t, err)
	assert.True(t, res.Replayed)
	assert.Equal(t, v, res.Value)
	assert.Equal(t, 2, runs)
}

// TestAttackObserverPanicsEverywhere: an observer that panics on every
// event, EventAcquired included, leaves no key claimed, on every path.
func TestAttackObserverPanicsEverywhere(t *testing.T) {
	r := newRunner(t, teststores.Memory(t), once.WithConfig(engine.Config{Observer: func(context.Context, engine.Event) { panic("observer") }}))
	ctx := context.Background()
	_, err := once.Do(ctx, r, id("op-1"), nil, func(context.Context) (int, error) { return 0, errors.New("retry me") })
	assert.EqualError(t, err, "retry me")
	v, err := once.Do(ctx, r, id("op-1"), nil, func(context.Context) (int, error) { return 1, nil })
	require.NoError(t, err)
	assert.Equal(t, 1, v)
	res, err := doResult(ctx, r, id("op-1"), nil, func(context.Context) (int, error) { return 2, nil })
	require.NoError(t, err)
	assert.True(t, res.Replayed)
	_, err = once.Do(ctx, r, id("op-1"), "other", func(context.Context) (int, error) { return 2, nil })
	assert.ErrorIs(t, err, engine.ErrKeyMismatch)
}

// TestAttackStoreErrorPanicsConcurrently: a store-error function that
// panics in many calls at once is recovered in every one of them.
func TestAttackStoreErrorPanicsConcurrently(t *testing.T) {
	for round := range 20 {
		const callers = 8
		var ready sync.WaitGroup
		ready.Add(callers)
		r := newRunner(t, teststores.Memory(t), once.WithKeep(func(error) bool {
			ready.Done()
			ready.Wait() // every caller panics at the same moment
			panic("store error")
		}))
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				_, err := once.Do(context.Background(), r, id(fmt.Sprintf("sp-%d-%d", round, i)), nil,
					func(context.Context) (int, error) { return 0, errors.New("transient") })
				assert.EqualError(t, err, "transient")
			})
		}
		wg.Wait()
	}
}

// notStorable is a Store that refuses every Complete whose response is
// larger than max bytes with ErrNotStorable, as a store at its size limit.
type notStorable struct {
	engine.Store
	max int
}

func (s notStorable) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if resp.Size() > s.max {
		return fmt.Errorf("too large: %w", engine.ErrNotStorable)
	}
	return s.Store.Complete(ctx, id, token, resp, ttl)
}

// TestAttackHugeResult: a result the store will not keep is recorded
// without it: fn does not run again, and later calls get ErrResultOmitted
// (or, for a permanent error, a StoredError without its message), on a
// store that refuses it (ErrNotStorable) and on a memstore whose byte bound
// it exceeds.
func TestAttackHugeResult(t *testing.T) {
	huge := strings.Repeat("x", 1<<16)
	for name, store := range map[string]engine.Store{
		"refused":  notStorable{teststores.Memory(t), 1 << 10},
		"memstore": teststores.Memory(t, memstore.WithMaxBytes(1<<12)),
	} {
		t.Run(name, func(t *testing.T) {
			r := newRunner(t, store)
			runs := 0
			fn := func(context.Context) (string, error) { runs++; return huge, nil }
			v, err := once.Do(context.Background(), r, id("huge-1"), nil, fn)
			require.NoError(t, err)
			assert.Len(t, v, len(huge))
			_, err = once.Do(context.Background(), r, id("huge-1"), nil, fn)
			assert.ErrorIs(t, err, engine.ErrResultOmitted)
			assert.Equal(t, 1, runs)

			// A permanent error too large to keep: fn does not run again.
			errHuge := once.Permanent(errors.New(huge))
			_, err = once.Do(context.Background(), r, id("huge-2"), nil, func(context.Context) (string, error) { runs++; return "", errHuge })
			assert.ErrorIs(t, err, once.ErrPermanent)
			_, err = once.Do(context.Background(), r, id("huge-2"), nil, fn)
			assert.ErrorIs(t, err, once.ErrPermanent, "the stored status says the call failed for good")
			assert.NotErrorIs(t, err, engine.ErrResultOmitted)
			assert.Equal(t, 2, runs)
		})
	}
}

// TestAttackHugeResultRealStores: a result of 4 MiB on PostgreSQL and Redis
// is stored and replayed whole.
func TestAttackHugeResultRealStores(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)
		big := strings.Repeat("y", 4<<20)
		fn := func(context.Context) (string, error) { return big, nil }
		_, err := once.Do(context.Background(), r, id("big-1"), nil, fn)
		require.NoError(t, err)
		res, err := doResult(context.Background(), r, id("big-1"), nil, fn)
		require.NoError(t, err)
		assert.True(t, res.Replayed)
		assert.Equal(t, len(big), len(res.Value))
	})
}

// TestAttackSharedWithHTTP: a key used by the HTTP middleware and by once on
// the same store, in the same scope, is a mismatch both ways, and never a
// replay of the other door's record; in flight in one door, it is refused
// in the other without waiting.
func TestAttackSharedWithHTTP(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		const scope = "shared"
		hold := make(chan struct{})
		var holding atomic.Bool
		handled := make(chan struct{}, 4)
		mw, err := server.New(store, server.WithScope(func(*http.Request) (string, error) { return scope, nil }))
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, mw.Shutdown(context.Background())) })
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handled <- struct{}{}
			if holding.Load() {
				<-hold
			}
			_, _ = w.Write([]byte(`{"N":1}`))
		}))
		post := func(key string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", key)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		r := newRunner(t, store, once.WithConfig(engine.Config{Wait: time.Minute}))
		ran := false
		fn := func(context.Context) (result, error) { ran = true; return result{N: 2}, nil }

		// HTTP first.
		require.Equal(t, http.StatusOK, post("k-http").Code)
		<-handled
		_, err = once.Do(context.Background(), r, engine.ID{Scope: scope, Key: "k-http"}, nil, fn)
		assert.ErrorIs(t, err, engine.ErrKeyMismatch)
		assert.False(t, ran)

		// once first.
		_, err = once.Do(context.Background(), r, engine.ID{Scope: scope, Key: "k-once"}, nil, fn)
		require.NoError(t, err)
		assert.Equal(t, http.StatusUnprocessableEntity, post("k-once").Code)

		// In flight in HTTP: once is refused at once, without a wait.
		holding.Store(true)
		done := make(chan int, 1)
		go func() { done <- post("k-flight").Code }()
		<-handled
		ran = false
		_, err = once.Do(context.Background(), r, engine.ID{Scope: scope, Key: "k-flight"}, nil, fn)
		assert.ErrorIs(t, err, engine.ErrKeyMismatch)
		assert.False(t, ran)
		close(hold)
		assert.Equal(t, http.StatusOK, <-done)
	})
}

// TestAttackNotCommitted: on a transactional PostgreSQL store, fn whose
// transaction cannot commit (a statement in it failed): its value does not
// reach the caller, who is refused with ErrStoreUnavailable, and the key is
// free, so the next call runs fn, whose committed write is kept with its
// result.
func TestAttackNotCommitted(t *testing.T) {
	store := teststores.Postgres(t, pgstore.WithTransactions())
	r := newRunner(t, store)
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context) (int, error) {
		runs++
		tx, ok := pgstore.TxFromContext(ctx)
		require.True(t, ok, "fn runs in the claim's transaction")
		if runs == 1 {
			_, err := tx.Exec(ctx, "SELECT 1/0")
			require.Error(t, err)
		}
		return runs, nil
	}
	v, err := once.Do(ctx, r, id("nc-1"), nil, fn)
	assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
	assert.ErrorIs(t, err, engine.ErrNotCommitted)
	assert.Zero(t, v, "the undone run's value is not returned")

	v, err = once.Do(ctx, r, id("nc-1"), nil, fn)
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	res, err := doResult(ctx, r, id("nc-1"), nil, fn)
	require.NoError(t, err)
	assert.True(t, res.Replayed)
	assert.Equal(t, 2, res.Value)
}

// TestAttackStoreEverythingCallerGone: with a store-error function that
// stores every error, fn that gives up with its own context's error (the
// caller went away, or the lease was lost) still releases the key: that
// error says nothing of the work, and stored it would be replayed to the
// very retry that should run fn.
func TestAttackStoreEverythingCallerGone(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store, once.WithKeep(func(error) bool { return true }))
		ctx, cancel := context.WithCancel(context.Background())
		_, err := once.Do(ctx, r, id("se-1"), nil, func(ctx context.Context) (int, error) {
			cancel()
			<-ctx.Done()
			return 0, fmt.Errorf("charging: %w", ctx.Err())
		})
		assert.ErrorIs(t, err, context.Canceled)
		res, err := doResult(context.Background(), r, id("se-1"), nil, func(context.Context) (int, error) { return 8, nil })
		require.NoError(t, err, "the retry runs fn instead of getting the stored cancellation")
		assert.False(t, res.Replayed)
		assert.Equal(t, 8, res.Value)

		// Permanent says so explicitly: stored.
		ctx, cancel = context.WithCancel(context.Background())
		_, err = once.Do(ctx, r, id("se-2"), nil, func(ctx context.Context) (int, error) {
			cancel()
			return 0, once.Permanent(ctx.Err())
		})
		assert.ErrorIs(t, err, once.ErrPermanent)
		_, err = once.Do(context.Background(), r, id("se-2"), nil, func(context.Context) (int, error) { return 8, nil })
		var stored *once.StoredError
		assert.ErrorAs(t, err, &stored)
	})
}

// TestAttackOddIDs: scopes and keys holding separators, NUL and bytes that
// are not UTF-8 are records of their own on every store.
func TestAttackOddIDs(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)
		ids := []engine.ID{
			{Scope: "a:b", Key: "c"}, {Scope: "a", Key: "b:c"}, {Scope: "", Key: "a:b:c"},
			{Scope: "\x00", Key: "\xff\xfe"}, {Scope: "\x00\x00", Key: "\xff"}, {Scope: "é", Key: "\x00"},
		}
		for i, key := range ids {
			v, err := once.Do(context.Background(), r, key, nil, func(context.Context) (int, error) { return i, nil })
			require.NoError(t, err, "%q", key)
			assert.Equal(t, i, v, "%q is a record of its own", key)
		}
		for i, key := range ids {
			res, err := doResult(context.Background(), r, key, nil, func(context.Context) (int, error) { return -1, nil })
			require.NoError(t, err, "%q", key)
			assert.True(t, res.Replayed)
			assert.Equal(t, i, res.Value, "%q", key)
		}
	})
}

// TestAttackEveryFault: each Store operation in turn fails, hangs, answers
// after its deadline or loses its answer, for every call of a first Do;
// then the store heals. Whatever the first caller got, fn never runs while
// another run of it is live, and once a caller got a value, every later
// call gets that value replayed.
func TestAttackEveryFault(t *testing.T) {
	const timeout = 30 * time.Millisecond
	faults := map[string]faultstore.Fault{
		"err":      {Err: errors.New("store down")},
		"hang":     {Hang: true},
		"slow":     {Delay: 2 * timeout},
		"errafter": {ErrAfter: errors.New("answer lost")},
	}
	ops := []faultstore.Op{faultstore.Claim, faultstore.Complete, faultstore.Release, faultstore.Extend}
	eachStore(t, func(t *testing.T, store engine.Store) {
		for _, op := range ops {
			for name, f := range faults {
				t.Run(op.String()+"/"+name, func(t *testing.T) {
					fs := faultstore.New(store)
					fs.Set(op, f)
					r := newRunner(t, fs, once.WithConfig(engine.Config{StoreTimeout: timeout, Lease: 150 * time.Millisecond}))
					key := id(teststores.UniqueName(t, "ef-"))
					var running, runs atomic.Int32
					fn := func(context.Context) (int, error) {
						if running.Add(1) != 1 {
							t.Error("fn runs twice at once")
						}
						defer running.Add(-1)
						n := runs.Add(1)
						if op == faultstore.Release && n == 1 {
							return 0, errors.New("transient") // so that the key is released
						}
						return int(n), nil
					}
					first, firstErr := once.Do(context.Background(), r, key, nil, fn)
					if firstErr != nil {
						var refusal *once.Error
						if !errors.As(firstErr, &refusal) {
							assert.EqualError(t, firstErr, "transient")
						}
					}
					ranFirst := runs.Load()
					fs.Clear(op)
					// Healed, with a store timeout that a busy machine's
					// store meets.
					healed := newRunner(t, fs, once.WithConfig(engine.Config{Lease: 150 * time.Millisecond}))
					res, err := untilRuns(t, healed, key, nil, fn)
					if op == faultstore.Release && ranFirst == 0 && err != nil && err.Error() == "transient" {
						// The first caller was refused before fn ran (on a
						// busy machine its claim can outlast 30 ms), so the
						// healed call made fn's first, failing run.
						res, err = untilRuns(t, healed, key, nil, fn)
					}
					require.NoError(t, err)
					if firstErr == nil {
						assert.True(t, res.Replayed)
						assert.Equal(t, first, res.Value, "the value the first caller got")
						assert.Equal(t, int32(1), runs.Load())
					}
				})
			}
		}
	})
}

// TestAttackNoTakeoverAcrossFingerprints: a holder of another door (another
// fingerprint) whose lease ended is never taken over by once: the key is a
// mismatch, and fn does not run under it.
func TestAttackNoTakeoverAcrossFingerprints(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		ctx := context.Background()
		key := id("abandoned-http")
		c, err := store.Claim(ctx, key, "an HTTP request's fingerprint", 20*time.Millisecond, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status)
		r := newRunner(t, store)
		ran := false
		// Past the dead holder's lease, polled: until then it is in flight
		// (a mismatch already, since the store knows its fingerprint).
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err = once.Do(ctx, r, key, nil, func(context.Context) (int, error) { ran = true; return 1, nil })
			require.ErrorIs(t, err, engine.ErrKeyMismatch)
			if lr, ok := store.(engine.Inspector); ok {
				rec, lerr := lr.Lookup(ctx, key)
				require.NoError(t, lerr)
				if !rec.LeaseEnds.IsZero() && time.Now().After(rec.LeaseEnds.Add(50*time.Millisecond)) {
					break
				}
			}
			require.True(t, time.Now().Before(deadline))
			time.Sleep(5 * time.Millisecond)
		}
		assert.False(t, ran)
	})
}

// TestAttackValueAfterLeaseLost: fn that returns a value after its lease was
// lost (its context cancelled) gives the caller that value; a later call
// gets it replayed if it was stored in the lease's last tenth, or runs fn
// again told of the lost holder, never anything else.
func TestAttackValueAfterLeaseLost(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		fs := faultstore.New(store)
		fs.Set(faultstore.Extend, faultstore.Fault{Err: errors.New("store down")})
		r := newRunner(t, fs, once.WithConfig(engine.Config{Lease: 300 * time.Millisecond, StoreTimeout: 100 * time.Millisecond}))
		v, err := once.Do(context.Background(), r, id("vl-1"), nil, func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 1, nil
		})
		require.NoError(t, err, "fn ran and returned a value")
		assert.Equal(t, 1, v)
		fs.Clear(faultstore.Extend)
		res, err := untilRuns(t, r, id("vl-1"), nil, func(ctx context.Context) (int, error) {
			l, _ := engine.LeaseFromContext(ctx)
			assert.Positive(t, l.Abandoned, "run again only after the holder was lost")
			return 2, nil
		})
		require.NoError(t, err)
		if res.Replayed {
			assert.Equal(t, 1, res.Value)
		} else {
			assert.Equal(t, 2, res.Value)
		}
	})
}

// TestAttackLongScope: a scope no store could index (a PostgreSQL index row
// holds about 8 KB) is refused as an invalid key, never answered as an
// outage to retry forever; the longest accepted one works on every store.
func TestAttackLongScope(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)
		for _, n := range []int{engine.MaxScopeLen, 16 << 10} {
			scope := make([]byte, n)
			for i := range scope {
				scope[i] = byte(i*7919 + i*i*31 + i>>3) // does not compress
			}
			id := engine.ID{Scope: string(scope), Key: "k"}
			_, err := once.Do(context.Background(), r, id, nil, func(context.Context) (int, error) { return 1, nil })
			if n <= engine.MaxScopeLen {
				assert.NoError(t, err)
				continue
			}
			assert.ErrorIs(t, err, once.ErrInvalidKey)
		}
	})
}

// explosive's encoding panics.
type explosive struct{ N int }

func (explosive) MarshalJSON() ([]byte, error) { panic("explosive: MarshalJSON") }

// TestResultCodecPanics: a result whose encoding panics was computed: the
// call is recorded as done without its value, and fn does not run again.
func TestResultCodecPanics(t *testing.T) {
	r := newRunner(t, teststores.Memory(t))
	runs := 0
	work := func(context.Context) (explosive, error) { runs++; return explosive{N: 1}, nil }
	v, err := once.Do(context.Background(), r, id("explosive"), nil, work)
	require.NoError(t, err)
	assert.Equal(t, 1, v.N)
	_, err = once.Do(context.Background(), r, id("explosive"), nil, work)
	assert.ErrorIs(t, err, engine.ErrResultOmitted)
	assert.Equal(t, 1, runs)
}
