package step_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
)

// catch calls f and returns what it panicked with, if it did.
func catch(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// TestStepPanics: a step's function that panics is a step whose holder was
// lost while it ran: the panic goes on, the door gives the key back, and
// the retry runs the step again under the default policy, or is told that
// its outcome is unknown under RefuseAbandoned (its start is recorded).
func TestStepPanics(t *testing.T) {
	for _, policy := range []engine.AbandonedPolicy{engine.RerunAbandoned, engine.RefuseAbandoned} {
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			forEachStore(t, func(t *testing.T, store engine.Store) {
				r := runner(t, store, quiet(engine.Config{Abandoned: policy}))
				id := engine.ID{Key: "panic-" + t.Name()}
				var runs atomic.Int32
				work := func(ctx context.Context) (int, error) {
					l, _ := engine.LeaseFromContext(ctx)
					assert.Equal(t, 0, l.Abandoned, "released, not lost")
					return step.Run(ctx, "charge", nil, func(context.Context) (int, error) {
						if runs.Add(1) == 1 {
							panic("charge: nil map")
						}
						return 2, nil
					})
				}
				p := catch(func() { _ = doErr(context.Background(), r, id, work) })
				require.Equal(t, "charge: nil map", p, "the panic goes on")
				v, err := once.Do(context.Background(), r, id, nil, work)
				if policy == engine.RefuseAbandoned {
					assert.ErrorIs(t, err, engine.ErrOutcomeUnknown)
					assert.Equal(t, int32(1), runs.Load())
					return
				}
				require.NoError(t, err)
				assert.Equal(t, 2, v)
				assert.Equal(t, int32(2), runs.Load())
			})
		})
	}
}

// explosive panics when encoded; its decoding is fine.
type explosive struct{ N int }

func (explosive) MarshalJSON() ([]byte, error) { panic("explosive: MarshalJSON") }

// fragile encodes fine, and panics when decoded.
type fragile struct{ N int }

func (f fragile) MarshalJSON() ([]byte, error) { return []byte(fmt.Sprint(f.N)), nil }
func (*fragile) UnmarshalJSON([]byte) error    { panic("fragile: UnmarshalJSON") }

// TestCodecPanics: a codec that panics (here JSON, calling a type's own
// MarshalJSON or UnmarshalJSON) is the codec failing: on a step's input
// the step is refused and does not run; on its result, the step ran, and
// is recorded as done without its value, so that the retry does not run it
// again; on a recorded result, the replay fails and the step does not run.
func TestCodecPanics(t *testing.T) {
	for _, policy := range []engine.AbandonedPolicy{engine.RerunAbandoned, engine.RefuseAbandoned} {
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			r := runner(t, newMemory(t), quiet(engine.Config{Abandoned: policy}))
			ctx := context.Background()

			t.Run("input", func(t *testing.T) {
				err := doErr(ctx, r, engine.ID{Key: "input"}, func(ctx context.Context) (int, error) {
					var p any
					var err error
					if p = catch(func() {
						_, err = step.Run(ctx, "s", explosive{}, func(context.Context) (int, error) {
							t.Error("ran with an input that could not be encoded")
							return 0, nil
						})
					}); p != nil {
						return 0, fmt.Errorf("step.Run panicked: %v", p)
					}
					assert.ErrorContains(t, err, "encoding its input")
					assert.ErrorContains(t, err, "explosive: MarshalJSON")
					v, err := step.Run(ctx, "s", 1, func(context.Context) (int, error) { return 1, nil })
					assert.NoError(t, err, "the name is free")
					return v, err
				})
				assert.NoError(t, err)
			})

			t.Run("result", func(t *testing.T) {
				id := engine.ID{Key: "result"}
				var runs atomic.Int32
				var got []string
				work := func(ctx context.Context) (int, error) {
					var v explosive
					var err error
					if p := catch(func() {
						v, err = step.Run(ctx, "s", nil, func(context.Context) (explosive, error) {
							return explosive{N: int(runs.Add(1))}, nil
						})
					}); p != nil {
						got = append(got, fmt.Sprint("panic: ", p))
						return 0, errTransient
					}
					got = append(got, fmt.Sprint(v.N, " ", err))
					return 0, errTransient
				}
				require.ErrorIs(t, doErr(ctx, r, id, work), errTransient)
				require.ErrorIs(t, doErr(ctx, r, id, work), errTransient)
				assert.Equal(t, int32(1), runs.Load(), "a step that ran is not run again")
				require.Len(t, got, 2)
				assert.Equal(t, "1 <nil>", got[0], "the run that ran it gets its value")
				assert.Contains(t, got[1], engine.ErrResultOmitted.Error())
			})

			t.Run("recorded result", func(t *testing.T) {
				id := engine.ID{Key: "decode"}
				var runs atomic.Int32
				var replay error
				second := false
				work := func(ctx context.Context) (int, error) {
					var err error
					if p := catch(func() {
						_, err = step.Run(ctx, "s", nil, func(context.Context) (fragile, error) {
							return fragile{N: int(runs.Add(1))}, nil
						})
					}); p != nil {
						err = fmt.Errorf("step.Run panicked: %v", p)
					}
					if second {
						replay = err
					}
					return 0, errTransient
				}
				require.ErrorIs(t, doErr(ctx, r, id, work), errTransient)
				second = true
				require.ErrorIs(t, doErr(ctx, r, id, work), errTransient)
				assert.Equal(t, int32(1), runs.Load())
				assert.ErrorContains(t, replay, "decoding its recorded result")
				assert.NotContains(t, fmt.Sprint(replay), "step.Run panicked")
			})
		})
	}
}

// TestManyGoroutines: steps run from many goroutines of one run, under
// names shared by several and names of their own: each name runs once in
// all, every other use of it in the run is refused without running, and the
// retry replays every one.
func TestManyGoroutines(t *testing.T) {
	for _, policy := range []engine.AbandonedPolicy{engine.RerunAbandoned, engine.RefuseAbandoned} {
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			forEachStore(t, func(t *testing.T, store engine.Store) {
				r := runner(t, store, quiet(engine.Config{Abandoned: policy}))
				id := engine.ID{Key: "many-" + t.Name()}
				const names, each = 6, 8
				var runs [names]atomic.Int32
				var refused atomic.Int32
				work := func(fail bool) func(ctx context.Context) (int, error) {
					return func(ctx context.Context) (int, error) {
						var wg sync.WaitGroup
						var sum, got atomic.Int64
						for g := range names * each {
							wg.Go(func() {
								i := g % names
								v, err := step.Run(ctx, fmt.Sprint("shared-", i), i, func(context.Context) (int, error) {
									runs[i].Add(1)
									return i + 1, nil
								})
								switch {
								case err == nil:
									got.Add(1)
									sum.Add(int64(v))
								case strings.Contains(err.Error(), "already used"):
									refused.Add(1)
								default:
									t.Errorf("step %d: %v", i, err)
								}
								_, err = step.Run(ctx, fmt.Sprint("own-", g), g, func(context.Context) (int, error) { return g, nil })
								assert.NoError(t, err)
							})
						}
						wg.Wait()
						assert.Equal(t, int64(names), got.Load(), "each shared name ran or replayed once")
						if fail {
							return 0, errTransient
						}
						return int(sum.Load()), nil
					}
				}
				require.ErrorIs(t, doErr(context.Background(), r, id, work(true)), errTransient)
				v, err := once.Do(context.Background(), r, id, nil, work(false))
				require.NoError(t, err)
				assert.Equal(t, names*(names+1)/2, v)
				for i := range runs {
					assert.Equal(t, int32(1), runs[i].Load(), "step shared-%d", i)
				}
				assert.Equal(t, int32(2*names*(each-1)), refused.Load())
			})
		})
	}
}

// TestRetriedNameRace: under RefuseAbandoned, a step whose function fails
// takes its start back; until that is recorded, its name is still in use.
// Otherwise a second use of the name, let in meanwhile, would record its
// own start and result, and the late removal of the first start would erase
// them: the step would run again on the retry.
func TestRetriedNameRace(t *testing.T) {
	s := newFaulty(t, newMemory(t))
	r := runner(t, s, quiet(engine.Config{Abandoned: engine.RefuseAbandoned}))
	id := engine.ID{Key: "k"}
	removing := make(chan struct{})
	proceed := make(chan struct{})
	var hold sync.Once
	s.setSave(func(ctx context.Context, st engine.Step, next func(context.Context) error) error {
		if isRemoval(st) {
			hold.Do(func() {
				close(removing)
				<-proceed
			})
		}
		return next(ctx)
	})
	var effects atomic.Int32
	first := true
	work := func(ctx context.Context) (int, error) {
		if !first {
			return step.Run(ctx, "send", nil, func(context.Context) (int, error) { return int(effects.Add(1)), nil })
		}
		first = false
		var wg sync.WaitGroup
		wg.Go(func() {
			_, err := step.Run(ctx, "send", nil, func(context.Context) (int, error) { return 0, errTransient })
			assert.ErrorIs(t, err, errTransient)
		})
		<-removing
		// The first use failed, and is taking its start back.
		_, err := step.Run(ctx, "send", nil, func(context.Context) (int, error) { return int(effects.Add(1)), nil })
		close(proceed)
		wg.Wait()
		if err == nil {
			return 0, errTransient // and the call is released after the send
		}
		return 0, err
	}
	_ = doErr(context.Background(), r, id, work)
	s.setSave(nil)
	_, err := awaitDoNil(t, r, id, work)
	if !errors.Is(err, engine.ErrOutcomeUnknown) {
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), effects.Load(), "the send happened once")
}

// awaitDoNil is awaitDo with input nil.
func awaitDoNil[T any](t *testing.T, r *once.Runner, id engine.ID, fn func(context.Context) (T, error)) (T, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := once.Do(context.Background(), r, id, nil, fn)
		if !errors.Is(err, engine.ErrInFlight) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStepAfterRun: a goroutine that outlives the work and runs a step
// after the call was settled (its key released here, so that the retry
// runs the work again) does not run it, even on a context that is not
// cancelled with the work's: its result could be recorded nowhere, and the
// retry would run the step a second time.
func TestStepAfterRun(t *testing.T) {
	for _, detach := range []bool{false, true} {
		t.Run(fmt.Sprint("detached=", detach), func(t *testing.T) {
			r := runner(t, newMemory(t), quiet(engine.Config{}))
			id := engine.ID{Key: "k"}
			var effects atomic.Int32
			late := make(chan error, 1)
			returned := make(chan struct{})
			var wg sync.WaitGroup
			defer wg.Wait()
			first := true
			work := func(ctx context.Context) (int, error) {
				if !first {
					return step.Run(ctx, "send", nil, func(context.Context) (int, error) { return int(effects.Add(1)), nil })
				}
				first = false
				if detach {
					ctx = context.WithoutCancel(ctx)
				}
				wg.Go(func() {
					<-returned
					_, err := step.Run(ctx, "send", nil, func(context.Context) (int, error) { return int(effects.Add(1)), nil })
					late <- err
				})
				return 0, errTransient
			}
			require.ErrorIs(t, doErr(context.Background(), r, id, work), errTransient)
			close(returned)
			err := <-late
			assert.Error(t, err, "a step run after its call was settled")
			assert.Equal(t, int32(0), effects.Load(), "the late step did not run")
			v, err := once.Do(context.Background(), r, id, nil, work)
			require.NoError(t, err)
			assert.Equal(t, 1, v)
			assert.Equal(t, int32(1), effects.Load())
		})
	}
}

// TestNestedSteps: a step run inside another step's function is a step of
// the call like any other: when the outer step fails after the inner one
// ran, the retry replays the inner one and runs the outer one again.
func TestNestedSteps(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		r := runner(t, store, quiet(engine.Config{}))
		id := engine.ID{Key: "nested-" + t.Name()}
		var outer, inner atomic.Int32
		work := func(ctx context.Context) (string, error) {
			return step.Run(ctx, "order", nil, func(ctx context.Context) (string, error) {
				n := outer.Add(1)
				ch, err := step.Run(ctx, "charge", nil, func(context.Context) (string, error) {
					return fmt.Sprint("ch_", inner.Add(1)), nil
				})
				if err != nil {
					return "", err
				}
				if n == 1 {
					return "", errTransient // the order fails after the charge
				}
				return "order for " + ch, nil
			})
		}
		require.ErrorIs(t, doErr(context.Background(), r, id, work), errTransient)
		v, err := once.Do(context.Background(), r, id, nil, work)
		require.NoError(t, err)
		assert.Equal(t, "order for ch_1", v)
		assert.Equal(t, [2]int32{2, 1}, [2]int32{outer.Load(), inner.Load()})
	})
}
