package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	runs, err := run(options{
		orders: 60, workers: 8, store: "memory",
		drop: 0.2, reset: 0.05, delay: 0.05, hold: 500 * time.Millisecond,
		timeout: 200 * time.Millisecond, seed: 7,
	}, &out)
	require.NoError(t, err, out.String())
	naive, idem := runs[0], runs[1]
	assert.Positive(t, naive.lost, "the proxy lost no response")
	assert.Equal(t, naive.lost, int64(naive.created-naive.distinct), "the naive run duplicates every lost response")
	assert.Equal(t, 60, idem.created, "orders created by the idempotent run")
	assert.Equal(t, 60, idem.distinct)
	assert.Zero(t, idem.failures.Load())
	assert.Equal(t, idem.lost, idem.replays, "every lost response is replayed")
	assert.Contains(t, out.String(), "duplicates")
}
