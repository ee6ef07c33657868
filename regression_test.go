package idempotency_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

// TestBusinessConflictSentOnce: a 409 that is not the in-flight answer is a
// business conflict, which another attempt would only repeat.
func TestBusinessConflictSentOnce(t *testing.T) {
	s := newScript(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		w.Write([]byte(`{"type":"https://api.example/problems/email-taken","title":"Email already registered"}`))
	}, status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.EqualValues(t, 1, s.hits.Load(), "server hits")
	assert.Contains(t, body, "email-taken", "the caller reads the whole problem")
	assert.Equal(t, 1, outcome(t, resp).Attempts)
}

// TestShouldRetryFalseStops: a server's "do not retry" hint stops a status
// that is otherwise retried.
func TestShouldRetryFalseStops(t *testing.T) {
	for _, header := range []string{"Stripe-Should-Retry", "X-Should-Retry"} {
		t.Run(header, func(t *testing.T) {
			s := newScript(status(http.StatusServiceUnavailable, header, "false"), status(http.StatusCreated))
			srv := newServer(t, s)
			c := newClient(t, srv)

			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.EqualValues(t, 1, s.hits.Load(), "server hits")
			assert.Equal(t, 1, outcome(t, resp).Attempts)
		})
	}
}

// TestShouldRetryTrueAllows: a server's "retry" hint makes a status that
// is otherwise final retried, within the same limits.
func TestShouldRetryTrueAllows(t *testing.T) {
	s := newScript(status(http.StatusBadRequest, "Stripe-Should-Retry", "true"))
	srv := newServer(t, s)
	c := newClient(t, srv, idempotency.WithMaxAttempts(3))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.EqualValues(t, 3, s.hits.Load(), "server hits: as many as WithMaxAttempts allows")
	keys := s.keysSeen()
	require.Len(t, keys, 3)
	assert.Equal(t, keys[0], keys[2], "one key on every attempt")
}

// TestMethodsLowerCase: WithMethods("post") keys and retries POSTs.
func TestMethodsLowerCase(t *testing.T) {
	s := newScript(lost, status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv, idempotency.WithMethods("post"))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	keys := s.keysSeen()
	require.Len(t, keys, 2)
	assert.NotEmpty(t, keys[0], "key of the POST")
	assert.Equal(t, keys[0], keys[1])
}

// TestObserverPanics: an observer that panics on every event leaves no
// connection and no goroutine behind, and the calls go on as if it had
// returned.
func TestObserverPanics(t *testing.T) {
	var conns atomic.Int64
	// Each first attempt is a 503 with a body, which must be drained for
	// its connection to be reused.
	s := newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))
	srv := newServer(t, s, func(hs *http.Server) {
		hs.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}
	})
	tr := srv.Client().Transport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	var logged bytes.Buffer
	var panics atomic.Int64
	c := clienttest.New(t,
		idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		idempotency.WithBackoff(0, 0),
		idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelError}))),
		idempotency.WithObserver(func(context.Context, idempotency.Event) {
			panics.Add(1)
			panic("observer bug")
		}),
	)
	before := runtime.NumGoroutine()

	const calls = 10 // two events each: 20 panics
	for i := range calls {
		s.set(0, status(http.StatusServiceUnavailable))
		s.hits.Store(0)
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("call %d: Do() panicked: %v", i, v)
				}
			}()
			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			if !assert.NoError(t, err) {
				return
			}
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			readAll(t, resp)
		}()
	}
	assert.EqualValues(t, 2*calls, panics.Load(), "observer calls")
	assert.EqualValues(t, 1, conns.Load(), "connections opened: one, reused")
	assert.Equal(t, 1, strings.Count(logged.String(), "recovered a panic"), "panics logged once:\n%s", logged.String())

	tr.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines after the calls")
}
