package step_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/idemkit/idempotency/step"
)

// faulty is a store that keeps steps, whose Claim, Complete, Release and
// Extend a test makes fail, hang or slow down through faultstore, and whose
// SaveStep it intercepts with save.
type faulty struct {
	*faultstore.Store
	inner engine.StepStore

	mu    sync.Mutex
	save  func(ctx context.Context, st engine.Step, next func(context.Context) error) error
	saves atomic.Int32
}

func newFaulty(t *testing.T, inner engine.Store) *faulty {
	t.Helper()
	ss, ok := inner.(engine.StepStore)
	require.True(t, ok, "%T keeps no steps", inner)
	return &faulty{Store: faultstore.New(inner), inner: ss}
}

var _ engine.StepStore = (*faulty)(nil)

// setSave makes every SaveStep go through f, which calls next to pass it
// on to the inner store; nil passes them all on.
func (s *faulty) setSave(f func(ctx context.Context, st engine.Step, next func(context.Context) error) error) {
	s.mu.Lock()
	s.save = f
	s.mu.Unlock()
}

func (s *faulty) SaveStep(ctx context.Context, id engine.ID, tok engine.Token, st engine.Step) error {
	s.saves.Add(1)
	s.mu.Lock()
	f := s.save
	s.mu.Unlock()
	next := func(ctx context.Context) error { return s.inner.SaveStep(ctx, id, tok, st) }
	if f == nil {
		return next(ctx)
	}
	return f(ctx, st, next)
}

// isRemoval reports whether st removes a step's record.
func isRemoval(st engine.Step) bool { return st.Fingerprint == "" }

var errDown = errors.New("store down")

// TestSaveStepFaults: a SaveStep that fails, hangs, is slow, fails for a
// while, or is applied but answered with an error, through once.Do under
// both policies: step.Run returns within the store timeout, says whether
// the step ran, and the retry neither runs a recorded step again nor is
// told "outcome unknown" of a step that never ran.
func TestSaveStepFaults(t *testing.T) {
	const timeout = 200 * time.Millisecond
	type outcome struct {
		first  error // what step.Run returned on the first call
		value  int   // and its value
		took   time.Duration
		retry  error // what step.Run returned on the retry
		rvalue int
		runs   int32 // how many times the step's function ran in all
	}
	// run calls a step under id with the fault set, then, with it
	// cleared, calls it again after the first call released its key.
	run := func(t *testing.T, policy engine.AbandonedPolicy, save func(ctx context.Context, st engine.Step, next func(context.Context) error) error) outcome {
		t.Helper()
		s := newFaulty(t, newMemory(t))
		r := runner(t, s, quiet(engine.Config{StoreTimeout: timeout, Abandoned: policy}))
		id := engine.ID{Key: "k"}
		var o outcome
		work := func(first bool) func(ctx context.Context) (int, error) {
			return func(ctx context.Context) (int, error) {
				start := time.Now()
				v, err := step.Run(ctx, "charge", "input", func(context.Context) (int, error) {
					return int(atomic.AddInt32(&o.runs, 1)), nil
				})
				if first {
					o.first, o.value, o.took = err, v, time.Since(start)
					return 0, errTransient // released: the retry resumes
				}
				o.retry, o.rvalue = err, v
				return v, err
			}
		}
		s.setSave(save)
		require.ErrorIs(t, doErr(context.Background(), r, id, work(true)), errTransient)
		s.setSave(nil)
		_ = doErr(context.Background(), r, id, work(false))
		return o
	}
	bound := timeout + 150*time.Millisecond // the store timeout, and the scheduler's slack

	for _, policy := range []engine.AbandonedPolicy{engine.RerunAbandoned, engine.RefuseAbandoned} {
		atMostOnce := policy == engine.RefuseAbandoned
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			t.Run("fails", func(t *testing.T) {
				o := run(t, policy, func(context.Context, engine.Step, func(context.Context) error) error { return errDown })
				require.ErrorIs(t, o.first, engine.ErrStoreUnavailable)
				assert.ErrorIs(t, o.first, errDown)
				assert.Less(t, o.took, bound)
				require.NoError(t, o.retry)
				if atMostOnce {
					assert.ErrorContains(t, o.first, "did not run")
					assert.Equal(t, int32(1), o.runs, "a step whose start was not recorded does not run")
				} else {
					assert.Equal(t, 1, o.value, "the step's value comes with the error")
					assert.Equal(t, int32(2), o.runs, "a step not recorded runs again on the retry")
				}
			})
			t.Run("hangs", func(t *testing.T) {
				o := run(t, policy, func(ctx context.Context, _ engine.Step, _ func(context.Context) error) error {
					<-ctx.Done()
					return ctx.Err()
				})
				require.ErrorIs(t, o.first, engine.ErrStoreUnavailable)
				assert.ErrorIs(t, o.first, context.DeadlineExceeded)
				assert.GreaterOrEqual(t, o.took, timeout-10*time.Millisecond)
				if atMostOnce {
					// The start, then its taking back: two store calls.
					assert.Less(t, o.took, timeout+bound, "bounded by the store timeout, twice")
				} else {
					assert.Less(t, o.took, bound, "bounded by the store timeout")
				}
				require.NoError(t, o.retry)
			})
			t.Run("slow", func(t *testing.T) {
				o := run(t, policy, func(ctx context.Context, _ engine.Step, next func(context.Context) error) error {
					select {
					case <-time.After(timeout / 4):
					case <-ctx.Done():
						return ctx.Err()
					}
					return next(ctx)
				})
				require.NoError(t, o.first)
				require.NoError(t, o.retry)
				assert.Equal(t, 1, o.rvalue)
				assert.Equal(t, int32(1), o.runs)
			})
			t.Run("fails for a while", func(t *testing.T) {
				var n atomic.Int32
				o := run(t, policy, func(ctx context.Context, _ engine.Step, next func(context.Context) error) error {
					if n.Add(1)%3 != 0 {
						return errDown // two of every three tries
					}
					return next(ctx)
				})
				require.NoError(t, o.first, "tried again within the store timeout")
				require.NoError(t, o.retry)
				assert.Equal(t, 1, o.rvalue)
				assert.Equal(t, int32(1), o.runs)
			})
			for _, late := range []bool{false, true} {
				// The store applies the write and fails: its answer is
				// lost, or (late) it applies it once the store timeout
				// has passed, as a server that runs a command queued
				// behind others, and the caller has given up.
				name := "applied, answer lost"
				if late {
					name = "applied after the deadline"
				}
				t.Run(name, func(t *testing.T) {
					o := run(t, policy, func(ctx context.Context, st engine.Step, next func(context.Context) error) error {
						if isRemoval(st) {
							return next(ctx)
						}
						if late {
							<-ctx.Done()
							if err := next(context.WithoutCancel(ctx)); err != nil {
								return err
							}
							return ctx.Err()
						}
						if err := next(ctx); err != nil {
							return err
						}
						return errDown
					})
					require.ErrorIs(t, o.first, engine.ErrStoreUnavailable)
					require.NoError(t, o.retry)
					assert.Equal(t, 1, o.rvalue)
					// Under RefuseAbandoned the start was recorded, and
					// the step did not run: the retry runs it, and is not
					// told that its outcome is unknown. Otherwise the
					// step's result was recorded, and it is replayed.
					assert.Equal(t, int32(1), o.runs)
				})
			}
		})
	}
}

// TestStepUnderStoreFaults: the lease's store calls failing around a step.
// An Extend that fails while a step runs ends the lease: the step's
// function sees its context end, and the steps after it do not run; a
// Claim that fails runs nothing.
func TestStepUnderStoreFaults(t *testing.T) {
	t.Run("extend", func(t *testing.T) {
		s := newFaulty(t, newMemory(t))
		s.Set(faultstore.Extend, faultstore.Fault{Err: errDown})
		r := runner(t, s, quiet(engine.Config{Lease: 150 * time.Millisecond}))
		var later atomic.Int32
		err := doErr(context.Background(), r, engine.ID{Key: "k"}, func(ctx context.Context) (int, error) {
			v, err := step.Run(ctx, "wait", nil, func(ctx context.Context) (int, error) {
				<-ctx.Done()
				assert.ErrorIs(t, context.Cause(ctx), engine.ErrLeaseExpired)
				return 1, nil // it ran, whatever its context says
			})
			assert.NoError(t, err, "recorded: nobody took the key over")
			assert.Equal(t, 1, v)
			_, err = step.Run(ctx, "after", nil, func(context.Context) (int, error) { return int(later.Add(1)), nil })
			assert.ErrorIs(t, err, engine.ErrLeaseExpired)
			return 0, err
		})
		assert.ErrorIs(t, err, engine.ErrLeaseExpired)
		assert.Equal(t, int32(0), later.Load())
	})
	t.Run("claim", func(t *testing.T) {
		s := newFaulty(t, newMemory(t))
		s.Set(faultstore.Claim, faultstore.Fault{Err: errDown})
		r := runner(t, s, quiet(engine.Config{StoreTimeout: 50 * time.Millisecond}))
		err := doErr(context.Background(), r, engine.ID{Key: "k"}, func(ctx context.Context) (int, error) {
			t.Error("ran without a lease")
			return 0, nil
		})
		assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
		assert.Equal(t, int32(0), s.saves.Load())
	})
	t.Run("release", func(t *testing.T) {
		// The key is released in the background once the store is back:
		// the retry then resumes.
		s := newFaulty(t, newMemory(t))
		s.Set(faultstore.Release, faultstore.Fault{Err: errDown, Times: 3})
		r := runner(t, s, quiet(engine.Config{StoreTimeout: 50 * time.Millisecond}))
		id := engine.ID{Key: "k"}
		var runs atomic.Int32
		work := func(fail bool) func(ctx context.Context) (int, error) {
			return func(ctx context.Context) (int, error) {
				v, err := step.Run(ctx, "s", nil, func(context.Context) (int, error) { return int(runs.Add(1)), nil })
				if err == nil && fail {
					return 0, errTransient
				}
				return v, err
			}
		}
		_, err := once.Do(context.Background(), r, id, "input", work(true))
		require.ErrorIs(t, err, errTransient)
		v, err := awaitDo(t, r, id, work(false))
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		assert.Equal(t, int32(1), runs.Load())
	})
}

func newMemory(t *testing.T) engine.Store { return teststores.Memory(t) }

// quiet is cfg with its log discarded: these tests make the store fail on
// purpose.
func quiet(cfg engine.Config) engine.Config {
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}
