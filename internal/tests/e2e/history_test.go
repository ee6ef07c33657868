package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/faultrun"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// TestHistory has concurrent clients place orders over a few shared keys
// through a lossy network, records every attempt and its answer, and checks
// the history against the protocol's sequential specification with a
// linearizability checker (porcupine), on every store: no key's order made
// twice, no replay of another order, no 409 after the order was made, no 422
// for the same body. A history that fails is kept, with porcupine's
// visualization, in the test's artifact directory (go test -artifacts).
func TestHistory(t *testing.T) {
	logSeed(t)
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			cfg := faultrun.HistoryConfig{
				Rounds: size(20, 500),
				Seed:   *seed,
				Drop:   0.10,
				Reset:  0.05,
				Delay:  0.05,
				// Short, so that a round that meets a delay is short.
				AttemptTimeout: 100 * time.Millisecond,
				ClientOptions: []idempotency.Option{
					// A 409 asks for a second's wait; a few
					// milliseconds keep the clients overlapping.
					idempotency.WithMaxRetryAfter(10 * time.Millisecond),
					idempotency.WithBackoff(time.Millisecond, 10*time.Millisecond),
				},
			}
			h, err := faultrun.RecordHistory(context.Background(), kind.New(t), cfg)
			require.NoError(t, err)
			answers := h.Answers()
			executions, twice := 0, 0
			for _, ids := range h.Executions {
				executions += len(ids)
				if len(ids) > 1 {
					twice++
				}
			}
			t.Logf("%d operations on %d keys, %d executions, %d keys run more than once; answers: %v; network: %+v",
				len(h.Operations), len(h.Executions), executions, twice, answers, h.Network)

			model := faultrun.Model()
			result, info := porcupine.CheckOperationsVerbose(model, h.Operations, time.Minute)
			if result != porcupine.Ok {
				keep(t, model, h, info)
				t.Log(h.Explain())
			}
			t.Logf("linearizability check: %v", result)
			assert.Equal(t, porcupine.Ok, result, "the history is not linearizable against the protocol")
			assert.Empty(t, h.Problems())
			// The history has what makes it worth checking.
			for _, k := range []faultrun.Kind{faultrun.Created, faultrun.Replayed, faultrun.Conflict, faultrun.Mismatch, faultrun.Unknown} {
				assert.Positive(t, answers[k], "no %v answer in the history", k)
			}
		})
	}
}

// keep writes the history and porcupine's visualization of it where the
// test's artifacts go.
func keep(t *testing.T, model porcupine.Model, h *faultrun.History, info porcupine.LinearizationInfo) {
	t.Helper()
	dir := t.ArtifactDir()
	path := filepath.Join(dir, "history.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("visualize: %v", err)
	}
	b, err := json.MarshalIndent(h.Operations, "", " ")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "history.json"), b, 0o644)
	}
	if err != nil {
		t.Errorf("keep the history: %v", err)
	}
	t.Logf("history kept in %s", dir)
}
