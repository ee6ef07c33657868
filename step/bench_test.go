package step_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
)

// counting is a StepStore that counts the calls the engine makes of it.
// On pgstore and redisstore each is one round trip to the server (a
// statement, a command or function call), so the count is a call's round
// trips there; the SQL stores' Claim reads before it claims (BENCHMARKS.md,
// section 7). The wrapper itself changes nothing on the wire.
type counting struct {
	engine.StepStore
	n atomic.Int64
}

func (c *counting) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c.n.Add(1)
	return c.StepStore.Claim(ctx, id, fp, lease, ttl)
}

func (c *counting) Complete(ctx context.Context, id engine.ID, tok engine.Token, resp *engine.Response, ttl time.Duration) error {
	c.n.Add(1)
	return c.StepStore.Complete(ctx, id, tok, resp, ttl)
}

func (c *counting) Release(ctx context.Context, id engine.ID, tok engine.Token) error {
	c.n.Add(1)
	return c.StepStore.Release(ctx, id, tok)
}

func (c *counting) Extend(ctx context.Context, id engine.ID, tok engine.Token, lease time.Duration) error {
	c.n.Add(1)
	return c.StepStore.Extend(ctx, id, tok, lease)
}

func (c *counting) SaveStep(ctx context.Context, id engine.ID, tok engine.Token, st engine.Step) error {
	c.n.Add(1)
	return c.StepStore.SaveStep(ctx, id, tok, st)
}

var _ engine.StepStore = (*counting)(nil)

// benchRunner returns a Runner on store, shut down when b ends.
func benchRunner(b *testing.B, store engine.Store, cfg engine.Config) *once.Runner {
	b.Helper()
	r, err := once.New(store, once.WithConfig(cfg))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r
}

// keys hands out keys that no other call of the benchmark has used.
type keys struct {
	prefix string
	n      atomic.Int64
}

func (k *keys) next() engine.ID {
	return engine.ID{Scope: "bench", Key: k.prefix + strconv.FormatInt(k.n.Add(1), 10)}
}

// plainWork does three trivial effects, as stepWork does in steps.
func plainWork(effects *atomic.Int64) func(context.Context) (int64, error) {
	return func(context.Context) (int64, error) {
		a := effects.Add(1)
		b := effects.Add(1)
		c := effects.Add(1)
		return a + b + c, nil
	}
}

// stepWork does n trivial effects, each in a step of its own.
func stepWork(effects *atomic.Int64, n int) func(context.Context) (int64, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = "effect-" + strconv.Itoa(i)
	}
	effect := func(context.Context) (int64, error) { return effects.Add(1), nil }
	return func(ctx context.Context) (int64, error) {
		var sum int64
		for i, name := range names {
			v, err := step.Run(ctx, name, i, effect)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
}

// BenchmarkSteps measures calls of the function door, once.Do, on each
// store that keeps steps: plain, a new key whose function does three
// trivial effects; steps, the same effects in three steps of package step
// (one SaveStep each); refuse, the same under engine.RefuseAbandoned (a
// SaveStep before and one after each step, as DBOS checkpoints a step);
// and replay, a call of a completed key. Each reports roundtrips/op, the
// store calls of one call (counting's), and fails unless they are 2, 5, 8
// and 1: a new key costs no call to learn that it holds no steps. paired runs the four at every iteration, each leading in turn,
// and times each apart: its ratios (steps/plain, refuse/plain,
// refuse/steps) are those of the cases' median times, over calls made at
// the same moments. On a loaded machine, sub-benchmarks run one after the
// other do not compare, and a mean follows the few calls that another
// process held up.
//
//	go test -run '^$' -bench BenchmarkSteps -benchmem ./step/
func BenchmarkSteps(b *testing.B) {
	for _, k := range teststores.All() {
		b.Run(k.Name, func(b *testing.B) {
			s, ok := k.New(b).(engine.StepStore)
			if !ok {
				b.Skipf("%s keeps no steps", k.Name)
			}
			store := &counting{StepStore: s}
			ctx := context.Background()
			def := benchRunner(b, store, engine.Config{})
			refuse := benchRunner(b, store, engine.Config{Abandoned: engine.RefuseAbandoned})
			ids := &keys{prefix: teststores.UniqueName(b, "k") + "-"}
			var effects atomic.Int64
			input := map[string]int{"amount": 1200}
			first := func(r *once.Runner, fn func(context.Context) (int64, error)) func() error {
				return func() error { _, err := once.Do(ctx, r, ids.next(), input, fn); return err }
			}
			replayed := ids.next()
			want, err := once.Do(ctx, def, replayed, input, stepWork(&effects, 3))
			if err != nil {
				b.Fatal(err)
			}
			ran := func(context.Context) (int64, error) { return 0, errors.New("a completed call ran again") }
			cases := []struct {
				name    string
				call    func() error
				trips   int64
				effects int64
			}{
				{"plain", first(def, plainWork(&effects)), 2, 3},
				{"steps", first(def, stepWork(&effects, 3)), 2 + 3, 3},
				{"refuse", first(refuse, stepWork(&effects, 3)), 2 + 2*3, 3},
				{"replay", func() error {
					got, err := once.Do(ctx, def, replayed, input, ran)
					if err == nil && got != want {
						err = fmt.Errorf("replay = %d, want %d", got, want)
					}
					return err
				}, 1, 0},
			}
			for _, c := range cases {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					calls, effects0 := store.n.Load(), effects.Load()
					for b.Loop() {
						if err := c.call(); err != nil {
							b.Fatal(err)
						}
					}
					reportTrips(b, store, calls, c.trips)
					if got, want := effects.Load()-effects0, c.effects*int64(b.N); got != want {
						b.Errorf("effects = %d, want %d", got, want)
					}
				})
			}
			b.Run("paired", func(b *testing.B) {
				spent := make([][]time.Duration, len(cases))
				for n := 0; b.Loop(); n++ {
					// Each case leads in turn, so that none is always
					// the one after a pause.
					for j := range cases {
						i := (n + j) % len(cases)
						start := time.Now()
						if err := cases[i].call(); err != nil {
							b.Fatal(err)
						}
						spent[i] = append(spent[i], time.Since(start))
					}
				}
				medians := make([]float64, len(cases))
				for i, c := range cases {
					medians[i] = median(spent[i])
					b.ReportMetric(medians[i], c.name+"-p50-ns")
				}
				b.ReportMetric(medians[1]/medians[0], "steps/plain")
				b.ReportMetric(medians[2]/medians[0], "refuse/plain")
				b.ReportMetric(medians[2]/medians[1], "refuse/steps")
			})
		})
	}
}

// median returns the median of d, in nanoseconds. It sorts d.
func median(d []time.Duration) float64 {
	slices.Sort(d)
	n := len(d)
	if n%2 == 1 {
		return float64(d[n/2])
	}
	return float64(d[n/2-1]+d[n/2]) / 2
}

// reportTrips reports the store calls since calls, per call of the
// benchmark, and fails unless they are want.
func reportTrips(b *testing.B, store *counting, calls, want int64) {
	b.Helper()
	got := store.n.Load() - calls
	b.ReportMetric(float64(got)/float64(b.N), "roundtrips/op")
	if got != want*int64(b.N) {
		b.Errorf("store calls = %d for %d calls, want %d each", got, b.N, want)
	}
}

// BenchmarkRun measures what a step adds to a call, on memstore: each
// iteration runs a call with no step and a call with ten, timed apart, and
// ns/step is the difference of their median times over ten; allocs/step
// and B/step are the difference of their means, counted over a thousand
// calls of each before the timed loop. first records each
// step (one SaveStep), refuse records its start too (two), and replayed
// resumes a released call whose ten steps are recorded (the call without
// steps resumes one with the same ten recorded), so it measures a replay
// from the journal.
//
//	go test -run '^$' -bench BenchmarkRun -benchmem ./step/
func BenchmarkRun(b *testing.B) {
	const perCall = 10
	store := teststores.Memory(b)
	ctx := context.Background()
	errRelease := errors.New("released")
	var effects atomic.Int64
	none := func(context.Context) (int64, error) { return 0, nil }
	ten := stepWork(&effects, perCall)

	// pair returns a benchmark of base and with, two calls that differ by
	// perCall steps.
	pair := func(base, with func() error) func(b *testing.B) {
		return func(b *testing.B) {
			allocs0, bytes0 := allocs(b, base)
			allocs1, bytes1 := allocs(b, with)
			var t0, t1 []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				if err := base(); err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := with(); err != nil {
					b.Fatal(err)
				}
				t0 = append(t0, mid.Sub(start))
				t1 = append(t1, time.Since(mid))
			}
			b.ReportMetric((median(t1)-median(t0))/perCall, "ns/step")
			b.ReportMetric((allocs1-allocs0)/perCall, "allocs/step")
			b.ReportMetric((bytes1-bytes0)/perCall, "B/step")
		}
	}
	firstCalls := func(r *once.Runner) func(b *testing.B) {
		ids := &keys{prefix: teststores.UniqueName(b, "k") + "-"}
		return pair(
			func() error { _, err := once.Do(ctx, r, ids.next(), "input", none); return err },
			func() error { _, err := once.Do(ctx, r, ids.next(), "input", ten); return err },
		)
	}
	b.Run("first", firstCalls(benchRunner(b, store, engine.Config{})))
	b.Run("refuse", firstCalls(benchRunner(b, store, engine.Config{Abandoned: engine.RefuseAbandoned})))
	b.Run("replayed", func(b *testing.B) {
		r := benchRunner(b, store, engine.Config{})
		released := func(id engine.ID, fn func(context.Context) (int64, error)) func() error {
			return func() error {
				_, err := once.Do(ctx, r, id, "input", func(ctx context.Context) (int64, error) {
					if _, err := fn(ctx); err != nil {
						return 0, err
					}
					return 0, errRelease
				})
				if !errors.Is(err, errRelease) {
					return err
				}
				return nil
			}
		}
		ids := &keys{prefix: teststores.UniqueName(b, "k") + "-"}
		base, with := ids.next(), ids.next()
		for _, id := range []engine.ID{base, with} {
			if err := released(id, ten)(); err != nil {
				b.Fatal(err)
			}
		}
		ran := effects.Load()
		pair(released(base, none), released(with, ten))(b)
		if got := effects.Load(); got != ran {
			b.Errorf("recorded steps ran %d times again", got-ran)
		}
	})
}

// allocs returns the heap allocations and bytes of one call of f, on
// average over a thousand.
func allocs(b *testing.B, f func() error) (n, bytes float64) {
	b.Helper()
	const runs = 1000
	if err := f(); err != nil { // warm up
		b.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / runs, float64(after.TotalAlloc-before.TotalAlloc) / runs
}
