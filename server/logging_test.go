package server_test

import (
	"log"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// useDefaultLogger makes slog.Default write to logs for the test, and puts
// the default back afterwards (slog.SetDefault also redirects package log).
func useDefaultLogger(t *testing.T, logs *syncBuffer) {
	t.Helper()
	old, out, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
}

// TestStoreFailuresLoggedByDefault: without WithLogger, a store that fails
// every call is reported through slog.Default, once for a burst of
// failures rather than once per request.
func TestStoreFailuresLoggedByDefault(t *testing.T) {
	var logs syncBuffer
	useDefaultLogger(t, &logs)
	h := &orders{}
	srv := fixtureWith(t, failing{}, h, server.WithScope(func(*http.Request) (string, error) { return "acme", nil }))
	const requests = 20
	for range requests {
		require.Equal(t, http.StatusServiceUnavailable, post(t, srv.URL, "k", "x").status)
	}
	assert.Equal(t, int64(0), h.executions.Load())
	got := strings.Count(logs.String(), "idempotency store failed")
	// Rate-limited to one record a second: a slow machine may see a
	// second one, never one a request.
	assert.GreaterOrEqual(t, got, 1, "logs: %s", logs.String())
	assert.Less(t, got, requests/2, "logs: %s", logs.String())
	assert.Contains(t, logs.String(), "store down", "the store's error is logged")
}

// TestLoggerOption: WithLogger replaces the default, which then hears
// nothing.
func TestLoggerOption(t *testing.T) {
	var def, own syncBuffer
	useDefaultLogger(t, &def)
	srv := fixtureWith(t, failing{}, &orders{}, server.WithConfig(engine.Config{Logger: slog.New(slog.NewTextHandler(&own, nil))}))
	require.Equal(t, http.StatusServiceUnavailable, post(t, srv.URL, "k", "x").status)
	assert.Contains(t, own.String(), "idempotency store failed")
	assert.Empty(t, def.String())
}
