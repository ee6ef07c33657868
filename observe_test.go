package idempotency_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

func TestLoggerAndHook(t *testing.T) {
	s := newScript(lost, status(http.StatusServiceUnavailable), status(http.StatusCreated))
	srv := newServer(t, s)
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var r retries
	c := newClient(t, srv, idempotency.WithLogger(logger), idempotency.WithObserver(r.hook))
	req := post(t, t.Context(), srv.URL+"/pay?token=querysecret", "card=4242424242424242")
	req.Header.Set("Authorization", "Bearer headersecret")

	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	key := outcome(t, resp).Key

	infos := r.all()
	require.Len(t, infos, 2)
	assert.Equal(t, key, infos[0].Key)
	assert.Equal(t, 1, infos[0].Attempt)
	assert.Zero(t, infos[0].StatusCode)
	assert.Error(t, infos[0].Err)
	assert.Equal(t, key, infos[1].Key)
	assert.Equal(t, 2, infos[1].Attempt)
	assert.Equal(t, http.StatusServiceUnavailable, infos[1].StatusCode)
	assert.NoError(t, infos[1].Err)

	out := buf.String()
	for _, secret := range []string{"querysecret", "headersecret", "4242"} {
		assert.NotContains(t, out, secret)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// The script's server echoes no key: the retried request's answer is
	// also reported as one from a server that may not honour keys.
	require.Len(t, lines, 3, "log:\n%s", out)
	var first, second, third map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &second))
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &third))
	assert.Equal(t, "WARN", third["level"])
	assert.Contains(t, third["msg"], "may not honour")
	assert.Equal(t, "INFO", first["level"])
	assert.Equal(t, "idempotency: retrying", first["msg"])
	assert.Equal(t, key, first["key"])
	assert.Equal(t, "POST", first["method"])
	assert.Equal(t, srv.URL+"/pay", first["url"])
	assert.EqualValues(t, 1, first["attempt"])
	assert.Contains(t, first, "error")
	assert.Contains(t, first, "wait")
	assert.EqualValues(t, 2, second["attempt"])
	assert.EqualValues(t, 503, second["status"])
}

func TestLoggerGivingUp(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusServiceUnavailable)))
	var buf bytes.Buffer
	c := newClient(t, srv, idempotency.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))), idempotency.WithMaxAttempts(1))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Contains(t, buf.String(), "level=WARN")
	assert.Contains(t, buf.String(), `msg="idempotency: not retrying"`)
	assert.Contains(t, buf.String(), `reason="attempts exhausted"`)
}

func TestQuietByDefault(t *testing.T) {
	srv := newServer(t, newScript(lost, status(http.StatusServiceUnavailable), status(http.StatusCreated)))
	c := clienttest.New(t, idempotency.WithHTTPClient(srv.Client()), idempotency.WithBackoff(time.Millisecond, time.Millisecond))

	// Nothing on os.Stderr, where go-retryablehttp's default logger, which
	// the Client once used, writes.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stderr := os.Stderr
	os.Stderr = w
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	os.Stderr = stderr
	w.Close()
	require.NoError(t, err)
	resp.Body.Close()
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Empty(t, string(out))
	assert.Equal(t, 3, outcome(t, resp).Attempts)
}
