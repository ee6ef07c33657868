package step_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/memstore"
)

// resumed runs work under a new key twice: the first run is released after
// work, the second resumes. It returns what work's steps returned on the
// second run, and how many step functions ran in all.
type resumed struct {
	t     *testing.T
	r     *once.Runner
	id    engine.ID
	runs  atomic.Int32
	retry bool
}

// run runs name's step, counting its runs.
func (s *resumed) run(ctx context.Context, name string, input any, v string) (string, error) {
	return step.Run(ctx, name, input, func(context.Context) (string, error) {
		s.runs.Add(1)
		return v, nil
	})
}

// twice runs work as a first run that is released, then as its retry.
func (s *resumed) twice(work func(ctx context.Context) error) {
	s.t.Helper()
	s.retry = false
	err := doErr(context.Background(), s.r, s.id, func(ctx context.Context) (int, error) {
		if err := work(ctx); err != nil {
			return 0, err
		}
		return 0, errTransient
	})
	require.ErrorIs(s.t, err, errTransient)
	s.retry = true
	require.NoError(s.t, doErr(context.Background(), s.r, s.id, func(ctx context.Context) (int, error) { return 0, work(ctx) }))
}

// TestNamesAtTheLimits: names of 255 bytes (in ASCII, and ending in a
// character of four bytes), names with bytes that stores quote or escape,
// are recorded and replayed whole by every store; a name of 256 bytes, one
// that is not UTF-8 and one with a control character (C0, DEL or C1) are
// refused without running.
func TestNamesAtTheLimits(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		s := &resumed{t: t, r: runner(t, store, quiet(engine.Config{})), id: engine.ID{Key: "names-" + t.Name()}}
		names := []string{
			strings.Repeat("n", 255),
			strings.Repeat("n", 251) + "😀",
			`quote'"back\slash`, `{"json":[1]}`, "{slot}:tag", "% _ * ? [a]", "naïve ☃ 日本", "tab-less\u00a0nbsp",
		}
		s.twice(func(ctx context.Context) error {
			for i, name := range names {
				v, err := s.run(ctx, name, i, fmt.Sprint("v", i))
				if err != nil {
					return err
				}
				assert.Equal(t, fmt.Sprint("v", i), v, "%q", name)
			}
			return nil
		})
		assert.Equal(t, int32(len(names)), s.runs.Load(), "every step replayed by its name")

		require.NoError(t, doErr(context.Background(), s.r, engine.ID{Key: "bad-names-" + t.Name()}, func(ctx context.Context) (int, error) {
			for _, name := range []string{
				strings.Repeat("n", 256),
				strings.Repeat("n", 252) + "😀",
				"bad\xffutf8", "\xc0\xaf", "nul\x00", "esc\x1b[31m", "del\x7f", "csi\u009b31m", "nel\u0085",
			} {
				_, err := step.Run(ctx, name, nil, func(context.Context) (int, error) {
					t.Errorf("step %q ran", name)
					return 0, nil
				})
				assert.Error(t, err, "%q", name)
			}
			return 0, nil
		}))
	})
}

// TestStepCountAtTheLimit: a call records 100 steps, counted across its
// runs: 60 in the first and 40 more in the retry are fine, the 101st is
// refused without running, and so is one more than 100 in one run.
func TestStepCountAtTheLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		s := &resumed{t: t, r: runner(t, store, quiet(engine.Config{})), id: engine.ID{Key: "count-" + t.Name()}}
		s.twice(func(ctx context.Context) error {
			n := 60
			if s.retry {
				n = 100
			}
			for i := range n {
				if _, err := s.run(ctx, fmt.Sprint("s", i), nil, "v"); err != nil {
					return err
				}
			}
			if !s.retry {
				return nil
			}
			_, err := step.Run(ctx, "s100", nil, func(context.Context) (int, error) {
				t.Error("the 101st step ran")
				return 0, nil
			})
			assert.ErrorContains(t, err, "at most 100 steps")
			// A recorded step is still replayed at the limit.
			_, err = step.Run(ctx, "s0", nil, func(context.Context) (int, error) { return 0, nil })
			assert.ErrorContains(t, err, "already used")
			return nil
		})
		assert.Equal(t, int32(100), s.runs.Load())
	})
}

// TestResultAtTheSizeLimit: a step whose record takes exactly 64 KiB (its
// name, its fingerprint and its result as recorded), under a short name
// and one of 255 bytes, is recorded with its value by every store, and
// replayed; one byte more is recorded without its value.
func TestResultAtTheSizeLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		// What package step records: the fingerprint of the input's JSON,
		// and a tag byte before the result's JSON (a string: its quotes).
		sum := sha256.Sum256([]byte("null"))
		fp := base64.RawURLEncoding.EncodeToString(sum[:])
		for _, name := range []string{"big", strings.Repeat("n", 255)} {
			fits := strings.Repeat("x", maxStepSize-len(name)-len(fp)-1-2)
			for _, tc := range []struct {
				v       string
				omitted bool
			}{{fits, false}, {fits + "x", true}} {
				s := &resumed{t: t, r: runner(t, store, quiet(engine.Config{})), id: engine.ID{Key: fmt.Sprint("size-", len(name), "-", len(tc.v), t.Name())}}
				var replay string
				var replayErr error
				s.twice(func(ctx context.Context) error {
					v, err := s.run(ctx, name, nil, tc.v)
					if !s.retry {
						assert.Equal(t, len(tc.v), len(v), "the run that ran it gets its value")
						return err
					}
					replay, replayErr = v, err
					return nil
				})
				assert.Equal(t, int32(1), s.runs.Load())
				if tc.omitted {
					assert.ErrorIs(t, replayErr, engine.ErrResultOmitted)
					continue
				}
				require.NoError(t, replayErr)
				assert.Equal(t, tc.v, replay)
			}
		}
	})
}

// TestStepNotStorable: a store that refuses a step's result for good
// (memstore at its byte bound) gets it recorded as done without its value,
// as a result too large for a step is: the step ran, and must not run
// again.
func TestStepNotStorable(t *testing.T) {
	store := teststores.Memory(t, memstore.WithMaxBytes(16<<10))
	s := &resumed{t: t, r: runner(t, store, quiet(engine.Config{})), id: engine.ID{Key: "k"}}
	big := strings.Repeat("x", 32<<10)
	var first, replay error
	s.twice(func(ctx context.Context) error {
		v, err := s.run(ctx, "export", nil, big)
		if !s.retry {
			first = err
			assert.Equal(t, big, v)
			return nil
		}
		replay = err
		return nil
	})
	assert.NoError(t, first, "recorded, without its value")
	assert.ErrorIs(t, replay, engine.ErrResultOmitted)
	assert.Equal(t, int32(1), s.runs.Load(), "the step ran once")
}

// maxStepSize is the most bytes a step's record takes (engine.StepStore).
const maxStepSize = 64 << 10
