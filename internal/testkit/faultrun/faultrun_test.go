package faultrun_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/testkit/faultrun"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// forgetful is a Store that grants every claim and keeps nothing: behind
// it, every retry runs again. The runs must see it.
type forgetful struct{ token atomic.Int64 }

func (f *forgetful) Claim(context.Context, engine.ID, string, time.Duration, time.Duration) (engine.Claim, error) {
	return engine.Claim{Status: engine.Acquired, Token: engine.Token(f.token.Add(1))}, nil
}
func (*forgetful) Complete(context.Context, engine.ID, engine.Token, *engine.Response, time.Duration) error {
	return nil
}
func (*forgetful) Release(context.Context, engine.ID, engine.Token) error { return nil }
func (*forgetful) Extend(context.Context, engine.ID, engine.Token, time.Duration) error {
	return nil
}

// quick are client options that keep a test's waits short.
var quick = []idempotency.Option{
	idempotency.WithBackoff(time.Millisecond, 10*time.Millisecond),
	idempotency.WithMaxRetryAfter(10 * time.Millisecond),
}

func smallRun(windows ...faultrun.Window) faultrun.Config {
	return faultrun.Config{
		Orders: 100, Callers: 8, Seed: 7,
		Drop: 0.2, Reset: 0.05, Delay: 0.05,
		AttemptTimeout: 200 * time.Millisecond,
		StoreTimeout:   300 * time.Millisecond,
		ResumeAfter:    20 * time.Millisecond,
		Windows:        windows,
		ClientOptions:  quick,
	}
}

func TestRunSeesDuplicates(t *testing.T) {
	rep, err := faultrun.Run(context.Background(), &forgetful{}, nil, smallRun())
	require.NoError(t, err)
	assert.Positive(t, rep.Duplicates, "duplicates behind a store that forgets")
	assert.Greater(t, rep.Executions, rep.Orders)
	assert.Positive(t, rep.AuditMismatched, "the audit's answers are new orders, not replays")
	assert.NotEmpty(t, rep.Problems())
}

func TestRunHealthy(t *testing.T) {
	s, err := memstore.New()
	require.NoError(t, err)
	defer s.Close()
	fs := faultstore.New(s)
	rep, err := faultrun.Run(context.Background(), fs, faultrun.FaultStoreLink(fs), smallRun(
		faultrun.Window{Fault: faultrun.Blackhole, After: 20, For: 300 * time.Millisecond},
		// Shorter than the store timeout: a Complete that fails is
		// retried until the store is back.
		faultrun.Window{Fault: faultrun.StoreCut, After: 40, For: 200 * time.Millisecond},
	))
	require.NoError(t, err)
	t.Log(rep)
	assert.Empty(t, rep.Problems())
	assert.Equal(t, 100, rep.Executions)
	assert.Equal(t, 100, rep.ConfirmedUnderFaults+rep.ConfirmedAfter)
	require.Len(t, rep.Windows, 2)
	assert.Positive(t, rep.Network.Blackholed)
	assert.Positive(t, rep.Windows[1].Refused)
	assert.Positive(t, rep.Amplification)
	assert.GreaterOrEqual(t, rep.AttemptsPerOrder.Max, rep.AttemptsPerOrder.P99)
}

// TestRunDeterministic runs the same seed twice without windows, whose
// timing is the clock's: each key's k'th request meets the same fault. How
// many requests a key sends depends on timeouts, so the test compares what
// both runs sent, never counts.
func TestRunDeterministic(t *testing.T) {
	run := func(seed uint64) *faultrun.Report {
		s, err := memstore.New()
		require.NoError(t, err)
		defer s.Close()
		cfg := smallRun()
		cfg.Seed = seed
		rep, err := faultrun.Run(context.Background(), s, nil, cfg)
		require.NoError(t, err)
		require.Len(t, rep.Faults, cfg.Orders, "keys whose requests met the faults")
		return rep
	}
	a, b, other := run(7), run(7), run(8)
	faulty := 0
	for key, fa := range a.Faults {
		fb := b.Faults[key]
		n := min(len(fa), len(fb))
		require.Positive(t, n, "%s sent no request in one of the runs", key)
		assert.Equal(t, fa[:n], fb[:n], "faults of %s's requests under one seed", key)
		if fa[0] != faultnet.Pass {
			faulty++
		}
	}
	assert.Positive(t, faulty, "no first request met a fault at these rates")

	// Another seed decides otherwise: the first requests, which every
	// order sends, meet other faults.
	differ := 0
	for key, fa := range a.Faults {
		if other.Faults[key][0] != fa[0] {
			differ++
		}
	}
	assert.Positive(t, differ, "seeds 7 and 8 gave every first request the same fault")
}

func TestRunRejects(t *testing.T) {
	s, err := memstore.New()
	require.NoError(t, err)
	defer s.Close()
	for name, cfg := range map[string]faultrun.Config{
		"no orders":            {},
		"window after the end": {Orders: 10, Windows: []faultrun.Window{{Fault: faultrun.Blackhole, After: 10, For: time.Second}}},
		"window of no time":    {Orders: 10, Windows: []faultrun.Window{{Fault: faultrun.Blackhole, For: 0}}},
		"store fault, no link": {Orders: 10, Windows: []faultrun.Window{{Fault: faultrun.StoreCut, For: time.Second}}},
		"slow without latency": {Orders: 10, Windows: []faultrun.Window{{Fault: faultrun.StoreSlow, For: time.Second}}},
		"unknown fault":        {Orders: 10, Windows: []faultrun.Window{{Fault: 9, For: time.Second}}},
	} {
		_, err := faultrun.Run(context.Background(), s, nil, cfg)
		assert.Error(t, err, name)
	}
}

func TestHistorySeesDuplicates(t *testing.T) {
	h, err := faultrun.RecordHistory(context.Background(), &forgetful{}, faultrun.HistoryConfig{
		Rounds: 3, Seed: 7, AttemptTimeout: 200 * time.Millisecond, ClientOptions: quick,
	})
	require.NoError(t, err)
	assert.False(t, porcupine.CheckOperations(faultrun.Model(), h.Operations), "the history behind a store that forgets is linearizable")
	assert.NotEmpty(t, h.Problems())
	assert.NotEmpty(t, h.Explain())
}

func TestHistoryHealthy(t *testing.T) {
	s, err := memstore.New()
	require.NoError(t, err)
	defer s.Close()
	h, err := faultrun.RecordHistory(context.Background(), s, faultrun.HistoryConfig{
		Rounds: 5, Seed: 7, Drop: 0.1, Reset: 0.05, Delay: 0.05, AttemptTimeout: 200 * time.Millisecond, ClientOptions: quick,
	})
	require.NoError(t, err)
	assert.True(t, porcupine.CheckOperations(faultrun.Model(), h.Operations))
	assert.Empty(t, h.Problems())
	assert.Empty(t, h.Explain())
	assert.Positive(t, h.Answers()[faultrun.Created])
}
