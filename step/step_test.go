package step_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// forEachStore runs fn against a fresh store of every kind that keeps
// steps.
func forEachStore(t *testing.T, fn func(t *testing.T, store engine.Store)) {
	for _, k := range teststores.All() {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, k.New(t))
		})
	}
}

func runner(t *testing.T, store engine.Store, cfg engine.Config) *once.Runner {
	t.Helper()
	r, err := once.New(store, once.WithConfig(cfg))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r
}

var errTransient = errors.New("transient")

// TestResumeAfterRelease: a run that fails after two steps releases its
// key; the retry gets both steps' results without running them, and runs
// the rest.
func TestResumeAfterRelease(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		ctx := context.Background()
		r := runner(t, store, engine.Config{})
		id := engine.ID{Scope: "t", Key: "resume-" + t.Name()}
		var charges, emails, orders atomic.Int32
		fail := true
		work := func(ctx context.Context) (string, error) {
			ch, err := step.Run(ctx, "charge", 1200, func(context.Context) (string, error) {
				return fmt.Sprintf("ch_%d", charges.Add(1)), nil
			})
			if err != nil {
				return "", err
			}
			if _, err := step.Run(ctx, "email", ch, func(context.Context) (struct{}, error) {
				emails.Add(1)
				return struct{}{}, nil
			}); err != nil {
				return "", err
			}
			if fail {
				return "", errTransient // released: the retry resumes
			}
			n, err := step.Run(ctx, "order", ch, func(context.Context) (int, error) { return int(orders.Add(1)), nil })
			return fmt.Sprintf("%s/order-%d", ch, n), err
		}
		_, err := once.Do(ctx, r, id, "input", work)
		require.ErrorIs(t, err, errTransient)
		fail = false
		v, err := once.Do(ctx, r, id, "input", work)
		require.NoError(t, err)
		assert.Equal(t, "ch_1/order-1", v)
		assert.Equal(t, [3]int32{1, 1, 1}, [3]int32{charges.Load(), emails.Load(), orders.Load()})
		// Completed: the call's result replays, no step runs.
		v, err = once.Do(ctx, r, id, "input", work)
		require.NoError(t, err)
		assert.Equal(t, "ch_1/order-1", v)
		assert.Equal(t, int32(1), charges.Load())
		// The released key belonged to "input": another input is refused.
		id2 := engine.ID{Scope: "t", Key: "resume-other-" + t.Name()}
		fail = true
		_, err = once.Do(ctx, r, id2, "input", work)
		require.ErrorIs(t, err, errTransient)
		_, err = once.Do(ctx, r, id2, "another input", work)
		assert.ErrorIs(t, err, engine.ErrKeyMismatch)
	})
}

// TestTakeoverResumes: a holder lost after recording one step (its lease
// ran out unrenewed while it hung) leaves it for the takeover, which
// replays it; under the default policy the run sees Abandoned > 0.
func TestTakeoverResumes(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		id := engine.ID{Scope: "t", Key: "takeover-" + t.Name()}
		var runs atomic.Int32
		charge := func(ctx context.Context) (string, error) {
			return step.Run(ctx, "charge", 1200, func(context.Context) (string, error) {
				return fmt.Sprintf("ch_%d", runs.Add(1)), nil
			})
		}
		lostHolder(t, store, engine.Config{}, id, func(ctx context.Context) {
			_, err := charge(ctx)
			assert.NoError(t, err)
		})
		r := runner(t, store, engine.Config{})
		v, err := awaitDo(t, r, id, func(ctx context.Context) (string, error) {
			l, _ := engine.LeaseFromContext(ctx)
			assert.Equal(t, 1, l.Abandoned)
			return charge(ctx)
		})
		require.NoError(t, err)
		assert.Equal(t, "ch_1", v)
		assert.Equal(t, int32(1), runs.Load(), "a finished step is not run again")
	})
}

// TestRefuseAbandonedBySteps: under RefuseAbandoned a takeover of a holder
// that recorded steps resumes: its finished steps replay, the step it
// started and never finished is "outcome unknown", and new steps run. A
// holder that recorded none leaves the whole call "outcome unknown".
func TestRefuseAbandonedBySteps(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		cfg := engine.Config{Abandoned: engine.RefuseAbandoned}
		id := engine.ID{Scope: "t", Key: "refuse-" + t.Name()}
		hung := make(chan struct{})
		lostHolder(t, store, cfg, id, func(ctx context.Context) {
			_, err := step.Run(ctx, "charge", 1, func(context.Context) (string, error) { return "ch_1", nil })
			assert.NoError(t, err)
			_, _ = step.Run(ctx, "email", 2, func(context.Context) (string, error) {
				<-hung // lost while the email is being sent, and hung
				return "", nil
			})
		})
		defer close(hung)
		r := runner(t, store, cfg)
		var ran []string
		v, err := awaitDo(t, r, id, func(ctx context.Context) (string, error) {
			ch, err := step.Run(ctx, "charge", 1, func(context.Context) (string, error) { ran = append(ran, "charge"); return "x", nil })
			require.NoError(t, err)
			_, err = step.Run(ctx, "email", 2, func(context.Context) (string, error) { ran = append(ran, "email"); return "", nil })
			require.ErrorIs(t, err, engine.ErrOutcomeUnknown)
			assert.ErrorContains(t, err, `"email"`)
			o, err := step.Run(ctx, "order", 3, func(context.Context) (string, error) { ran = append(ran, "order"); return "o_1", nil })
			return ch + "+" + o, err
		})
		require.NoError(t, err)
		assert.Equal(t, "ch_1+o_1", v)
		assert.Equal(t, []string{"order"}, ran)

		// No step recorded: the whole call is refused, as without steps.
		id2 := engine.ID{Scope: "t", Key: "refuse-nosteps-" + t.Name()}
		lostHolder(t, store, cfg, id2, func(context.Context) {})
		_, err = awaitDo(t, r, id2, func(ctx context.Context) (string, error) {
			t.Error("a call whose lost holder recorded no step ran")
			return "", nil
		})
		assert.ErrorIs(t, err, engine.ErrOutcomeUnknown)
	})
}

// noExtend is a store whose leases are never renewed: its holders are
// lost once their lease ends, as a hung process's are.
type noExtend struct{ engine.StepStore }

func (noExtend) Extend(context.Context, engine.ID, engine.Token, time.Duration) error {
	return errors.New("extend refused")
}

// lostHolder runs work under id with input "input" as a holder that hangs
// after it: its lease runs out unrenewed, and it answers nothing until the
// test ends. It returns once the lease is over.
func lostHolder(t *testing.T, store engine.Store, cfg engine.Config, id engine.ID, work func(ctx context.Context)) {
	t.Helper()
	cfg.Lease = 150 * time.Millisecond
	r := runner(t, noExtend{store.(engine.StepStore)}, cfg)
	done := make(chan struct{})
	over := make(chan struct{})
	unhang := make(chan struct{})
	t.Cleanup(func() {
		close(unhang)
		<-done
	})
	go func() {
		defer close(done)
		_, _ = once.Do(context.Background(), r, id, "input", func(ctx context.Context) (int, error) {
			go func() {
				<-ctx.Done() // the lease ended unrenewed
				close(over)
			}()
			work(ctx)
			// Hung: it neither completes nor releases until the test
			// ends; by then it was taken over, and is fenced off.
			<-unhang
			return 0, nil
		})
	}()
	<-over
}

// awaitDo calls once.Do with input "input" until the key is no longer in
// flight.
func awaitDo[T any](t *testing.T, r *once.Runner, id engine.ID, fn func(context.Context) (T, error)) (T, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := once.Do(context.Background(), r, id, "input", fn)
		if !errors.Is(err, engine.ErrInFlight) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func doErr[T any](ctx context.Context, r *once.Runner, id engine.ID, fn func(context.Context) (T, error)) error {
	_, err := once.Do(ctx, r, id, nil, fn)
	return err
}

// TestAtMostOnceRecordsStart: under RefuseAbandoned a step's start is in
// the store while its function runs; a function that fails takes it back,
// so the retry runs the step again.
func TestAtMostOnceRecordsStart(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		in, ok := store.(engine.Inspector)
		if !ok {
			t.Fatalf("%T is no Inspector", store)
		}
		ctx := context.Background()
		r := runner(t, store, engine.Config{Abandoned: engine.RefuseAbandoned})
		id := engine.ID{Scope: "t", Key: "start-" + t.Name()}
		attempt := 0
		v, err := once.Do(ctx, r, id, nil, func(ctx context.Context) (int, error) {
			attempt++
			return step.Run(ctx, "send", "x", func(context.Context) (int, error) {
				rec, err := in.Lookup(ctx, id)
				require.NoError(t, err)
				require.Len(t, rec.Steps, 1)
				assert.Equal(t, "send", rec.Steps[0].Name)
				assert.False(t, rec.Steps[0].Done, "recorded as started while it runs")
				return 7, nil
			})
		})
		require.NoError(t, err)
		assert.Equal(t, 7, v)

		id2 := engine.ID{Scope: "t", Key: "start-fail-" + t.Name()}
		runs := 0
		work := func(ctx context.Context) (int, error) {
			return step.Run(ctx, "send", "x", func(context.Context) (int, error) {
				runs++
				if runs == 1 {
					return 0, errTransient
				}
				return runs, nil
			})
		}
		_, err = once.Do(ctx, r, id2, nil, work)
		require.ErrorIs(t, err, errTransient)
		// The failed step's start was taken back: with no step recorded,
		// the release deletes the record.
		_, err = in.Lookup(ctx, id2)
		assert.ErrorIs(t, err, engine.ErrNotFound)
		v, err = once.Do(ctx, r, id2, nil, work)
		require.NoError(t, err)
		assert.Equal(t, 2, v)
	})
}

// TestRunRefusals: what Run refuses, and that fn does not run then.
func TestRunRefusals(t *testing.T) {
	store := teststores.Memory(t)
	ctx := context.Background()
	r := runner(t, store, engine.Config{})
	never := func(context.Context) (int, error) {
		t.Error("fn ran")
		return 0, nil
	}
	one := func(context.Context) (int, error) { return 1, nil }

	_, err := step.Run(ctx, "a", nil, one)
	assert.ErrorIs(t, err, step.ErrNoSteps, "outside a protected call")

	do := func(key string, fn func(ctx context.Context) (int, error)) error {
		_, err := once.Do(ctx, r, engine.ID{Key: key}, nil, fn)
		return err
	}
	require.NoError(t, do("names", func(ctx context.Context) (int, error) {
		for name, want := range map[string]string{
			"":                       "needs a name",
			strings.Repeat("n", 256): "longer than 255",
			"bad\xff":                "not valid UTF-8",
			"line\nbreak":            "control character",
			"del\x7f":                "control character",
		} {
			_, err := step.Run(ctx, name, nil, never)
			assert.ErrorContains(t, err, want, "%q", name)
		}
		_, err := step.Run[int](ctx, "nil", nil, nil)
		assert.ErrorContains(t, err, "needs a function")
		_, err = step.Run(ctx, "input", "bad\xff", never)
		assert.ErrorContains(t, err, "encoding its input")

		_, err = step.Run(ctx, "twice", nil, one)
		require.NoError(t, err)
		_, err = step.Run(ctx, "twice", nil, never)
		assert.ErrorContains(t, err, "already used")
		// A failed step's name may be tried again in the same run.
		_, err = step.Run(ctx, "retry", nil, func(context.Context) (int, error) { return 0, errTransient })
		require.ErrorIs(t, err, errTransient)
		v, err := step.Run(ctx, "retry", nil, one)
		require.NoError(t, err)
		assert.Equal(t, 1, v)
		return 0, nil
	}))

	// A changed input is refused on the retry.
	fail := true
	work := func(input int) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			v, err := step.Run(ctx, "s", input, func(context.Context) (int, error) { return input, nil })
			if err == nil && fail {
				return 0, errTransient
			}
			return v, err
		}
	}
	require.ErrorIs(t, do("mismatch", work(1)), errTransient)
	fail = false
	assert.ErrorIs(t, do("mismatch", work(2)), engine.ErrKeyMismatch)

	// A call records at most MaxSteps steps.
	require.NoError(t, do("many", func(ctx context.Context) (int, error) {
		for i := range 100 {
			if _, err := step.Run(ctx, fmt.Sprint(i), nil, one); err != nil {
				return 0, err
			}
		}
		_, err := step.Run(ctx, "one-too-many", nil, never)
		assert.ErrorContains(t, err, "at most 100 steps")
		return 0, nil
	}))

	// A context already done does not run the step.
	require.NoError(t, do("done", func(ctx context.Context) (int, error) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := step.Run(cctx, "a", nil, never)
		assert.ErrorIs(t, err, context.Canceled)
		v, err := step.Run(ctx, "a", nil, one)
		assert.NoError(t, err, "the name is free again")
		assert.Equal(t, 1, v)
		return 0, nil
	}))
}

// TestResultOmitted: a result too large for a step record is recorded as
// omitted: the run that ran it gets it, and the retry is told, without
// running the step again.
func TestResultOmitted(t *testing.T) {
	store := teststores.Memory(t)
	ctx := context.Background()
	r := runner(t, store, engine.Config{})
	id := engine.ID{Key: "big"}
	runs := 0
	big := strings.Repeat("x", 64<<10)
	var got []string
	work := func(ctx context.Context) (int, error) {
		v, err := step.Run(ctx, "big", nil, func(context.Context) (string, error) { runs++; return big, nil })
		got = append(got, fmt.Sprint(len(v)))
		if err != nil {
			return 0, err
		}
		return 0, errTransient
	}
	require.ErrorIs(t, doErr(ctx, r, id, work), errTransient)
	err := doErr(ctx, r, id, work)
	assert.ErrorIs(t, err, engine.ErrResultOmitted)
	assert.Equal(t, 1, runs)
	assert.Equal(t, []string{fmt.Sprint(len(big)), "0"}, got)
}

// failingSteps is a memstore whose SaveStep fails after n successes.
type failingSteps struct {
	engine.StepStore
	left atomic.Int32
}

func (s *failingSteps) SaveStep(ctx context.Context, id engine.ID, tok engine.Token, st engine.Step) error {
	if s.left.Add(-1) < 0 {
		return errors.New("store down")
	}
	return s.StepStore.SaveStep(ctx, id, tok, st)
}

// TestNotRecorded: a step that ran but was not recorded returns its value
// and an error wrapping ErrStoreUnavailable; under RefuseAbandoned a step
// whose start is not recorded does not run.
func TestNotRecorded(t *testing.T) {
	ctx := context.Background()
	fs := &failingSteps{StepStore: teststores.Memory(t)}
	r := runner(t, fs, engine.Config{StoreTimeout: 50 * time.Millisecond})
	v, err := once.Do(ctx, r, engine.ID{Key: "a"}, nil, func(ctx context.Context) (int, error) {
		return step.Run(ctx, "s", nil, func(context.Context) (int, error) { return 5, nil })
	})
	assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
	assert.ErrorContains(t, err, "store down")
	assert.Equal(t, 5, v, "the step's value comes with the error")

	fs2 := &failingSteps{StepStore: teststores.Memory(t)}
	r2 := runner(t, fs2, engine.Config{StoreTimeout: 50 * time.Millisecond, Abandoned: engine.RefuseAbandoned})
	_, err = once.Do(ctx, r2, engine.ID{Key: "b"}, nil, func(ctx context.Context) (int, error) {
		v, err := step.Run(ctx, "s", nil, func(context.Context) (int, error) {
			t.Error("a step whose start was not recorded ran")
			return 0, nil
		})
		assert.ErrorContains(t, err, "did not run")
		return v, err
	})
	assert.ErrorIs(t, err, engine.ErrStoreUnavailable)
}

// TestNoStepStore: a Store that keeps no steps is named in the error.
func TestNoStepStore(t *testing.T) {
	r := runner(t, plainStore{teststores.Memory(t)}, engine.Config{})
	_, err := once.Do(context.Background(), r, engine.ID{Key: "a"}, nil, func(ctx context.Context) (int, error) {
		return step.Run(ctx, "s", nil, func(context.Context) (int, error) { return 1, nil })
	})
	assert.ErrorIs(t, err, step.ErrNoSteps)
	assert.ErrorContains(t, err, "does not keep steps")
}

type plainStore struct{ engine.Store }

// TestConcurrentSteps: steps of one run on several goroutines are all
// recorded, and replayed.
func TestConcurrentSteps(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		ctx := context.Background()
		r := runner(t, store, engine.Config{})
		id := engine.ID{Key: "concurrent-" + t.Name()}
		var runs atomic.Int32
		fail := true
		work := func(ctx context.Context) (int, error) {
			var wg sync.WaitGroup
			var sum atomic.Int64
			for i := range 10 {
				wg.Go(func() {
					v, err := step.Run(ctx, fmt.Sprint("email-", i), i, func(context.Context) (int, error) {
						runs.Add(1)
						return i * i, nil
					})
					assert.NoError(t, err)
					sum.Add(int64(v))
				})
			}
			wg.Wait()
			if fail {
				return 0, errTransient
			}
			return int(sum.Load()), nil
		}
		require.ErrorIs(t, doErr(ctx, r, id, work), errTransient)
		fail = false
		v, err := once.Do(ctx, r, id, nil, work)
		require.NoError(t, err)
		assert.Equal(t, 285, v)
		assert.Equal(t, int32(10), runs.Load())
	})
}

// TestDerivedKeyFollowsStep: inside a step the client derives a request's
// key from the step's name, as ContextWithStep would, so that a resumed
// step sends the key its first run sent.
func TestDerivedKeyFollowsStep(t *testing.T) {
	var keys []string
	var mu sync.Mutex
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer downstream.Close()
	client, err := idempotency.NewClient()
	require.NoError(t, err)
	post := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, downstream.URL+"/charges", strings.NewReader("{}"))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	r := runner(t, teststores.Memory(t), engine.Config{})
	var want string
	_, err = once.Do(context.Background(), r, engine.ID{Scope: "s", Key: "k"}, nil, func(ctx context.Context) (int, error) {
		want, _ = client.DerivedKey(ctx, "charge")
		require.NoError(t, post(idempotency.ContextWithStep(ctx, "charge")))
		_, err := step.Run(ctx, "charge", nil, func(ctx context.Context) (int, error) { return 0, post(ctx) })
		require.NoError(t, err)
		_, err = step.Run(ctx, "refund", nil, func(ctx context.Context) (int, error) { return 0, post(ctx) })
		return 0, err
	})
	require.NoError(t, err)
	require.Len(t, keys, 3)
	assert.Equal(t, want, keys[0])
	assert.Equal(t, keys[0], keys[1], "the step's request has the key ContextWithStep gives")
	assert.NotEqual(t, keys[1], keys[2], "another step, another key")
}

// TestLateSaveDuringComplete: a step that finishes as the work returns is
// not recorded while the call is settled (on pgstore's transaction, that
// would send two statements at once on its connection).
func TestLateSaveDuringComplete(t *testing.T) {
	store := teststores.Postgres(t, pgstore.WithTransactions())
	r := runner(t, store, engine.Config{})
	for i := range 20 {
		var wg sync.WaitGroup
		returned := make(chan struct{})
		_, err := once.Do(context.Background(), r, engine.ID{Key: fmt.Sprint("late-", i)}, nil, func(ctx context.Context) (int, error) {
			wg.Go(func() {
				_, _ = step.Run(ctx, "late", nil, func(context.Context) (int, error) { <-returned; return 1, nil })
			})
			close(returned)
			return 1, nil
		})
		require.NoError(t, err)
		wg.Wait()
	}
}
