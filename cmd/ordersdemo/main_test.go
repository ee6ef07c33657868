package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	runs, err := Run(Options{
		Orders: 60, Workers: 8, Store: "memory",
		Drop: 0.2, Reset: 0.05, Delay: 0.05, Hold: 500 * time.Millisecond,
		Timeout: 200 * time.Millisecond, Seed: 7,
	}, &out)
	require.NoError(t, err, out.String())
	naive, idem := runs[0], runs[1]
	assert.Positive(t, naive.Lost, "the proxy lost no response")
	assert.Equal(t, naive.Lost, int64(naive.Created-naive.Distinct), "the naive run duplicates every lost response")
	assert.Equal(t, 60, idem.Created, "orders created by the idempotent run")
	assert.Equal(t, 60, idem.Distinct)
	assert.Zero(t, idem.Failures.Load())
	assert.Equal(t, idem.Lost, idem.Events[engine.EventReplayed], "every lost response is replayed")
	assert.Contains(t, out.String(), "duplicates")

	// The middleware's events: the naive run's requests carry no key; the
	// idempotent run executes each order once.
	assert.Equal(t, int64(naive.Created), naive.Events[engine.EventUnprotected], "naive run: requests without a key")
	assert.Zero(t, naive.Events[engine.EventExecuted])
	assert.Equal(t, int64(60), idem.Events[engine.EventExecuted], "idempotent run: first executions")
	assert.Equal(t, idem.Events[engine.EventExecuted], idem.Events[engine.EventAcquired])
	assert.Zero(t, idem.Events[engine.EventUnprotected])
	assert.Zero(t, idem.Events[engine.EventUnavailable])
	assert.Contains(t, out.String(), "first executions")
	assert.Contains(t, out.String(), "409 in flight")
}
