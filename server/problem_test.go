package server_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// problemOf decodes a problem+json answer.
func problemOf(t *testing.T, got reply) (p struct {
	Type, Title, Detail, Code string
	Status                    int
}) {
	t.Helper()
	require.Equal(t, "application/problem+json", got.header.Get("Content-Type"), "body %q", got.body)
	require.NoError(t, json.Unmarshal([]byte(got.body), &p), "body %q", got.body)
	return p
}

// TestProblemCodes: every problem the middleware writes carries its code,
// in the body and in Error.Code; a key over 255 bytes has its own.
func TestProblemCodes(t *testing.T) {
	var mu sync.Mutex
	var last *server.Error
	writer := server.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, err error) {
		mu.Lock()
		errors.As(err, &last)
		mu.Unlock()
		server.WriteProblem(w, r, err)
	})
	h := newBlocking()
	srv, _ := fixture(t, h, writer, server.WithMaxBody(8))
	down := fixtureWith(t, failing{}, &orders{}, writer, server.WithConfig(engine.Config{Logger: discardLogger()}))
	unidentified, _ := fixture(t, &orders{}, writer, server.WithScope(func(*http.Request) (string, error) {
		return "", errors.New("no principal")
	}))

	// A request in flight, for the 409 and the 422.
	first := postAsync(srv.URL, "busy", "x")
	<-h.started
	defer func() {
		close(h.release)
		assert.Equal(t, http.StatusCreated, recv(t, first, "the first answer").status)
	}()

	for _, tc := range []struct {
		name   string
		url    string
		key    string
		body   string
		status int
		code   string
	}{
		{"missing", srv.URL, "", "x", http.StatusBadRequest, "key_missing"},
		{"malformed", srv.URL, `"abc`, "x", http.StatusBadRequest, "key_invalid"},
		{"non-ASCII", srv.URL, "clé", "x", http.StatusBadRequest, "key_invalid"},
		{"256 bytes", srv.URL, strings.Repeat("k", 256), "x", http.StatusBadRequest, "key_too_long"},
		{"too large", srv.URL, "k", "123456789", http.StatusRequestEntityTooLarge, "body_too_large"},
		{"in flight", srv.URL, "busy", "x", http.StatusConflict, "in_flight"},
		{"mismatch", srv.URL, "busy", "y", http.StatusUnprocessableEntity, "key_mismatch"},
		{"unavailable", down.URL, "k", "x", http.StatusServiceUnavailable, "store_unavailable"},
		{"unidentified", unidentified.URL, "k", "x", http.StatusBadRequest, "request_unidentified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, tc.url, tc.key, tc.body)
			require.Equal(t, tc.status, got.status)
			p := problemOf(t, got)
			assert.Equal(t, tc.code, p.Code)
			assert.Equal(t, tc.status, p.Status)
			mu.Lock()
			defer mu.Unlock()
			require.NotNil(t, last)
			assert.Equal(t, tc.code, last.Code)
			last = nil
		})
	}
	t.Run("unreadable", func(t *testing.T) {
		// Declares more than it sends, then closes its side.
		status, err := rawPostShort(srv.Listener.Addr().String(), "Idempotency-Key: short\r\n", 8, "ab")
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, status)
		mu.Lock()
		defer mu.Unlock()
		require.NotNil(t, last)
		assert.Equal(t, "body_unreadable", last.Code)
	})
}

// TestWriteProblemWithoutError: an error that is not an *Error is a 500,
// with no code to promise.
func TestWriteProblemWithoutError(t *testing.T) {
	srv := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		server.WriteProblem(w, r, errors.New("boom"))
	}))
	got := post(t, srv.URL, "", "")
	assert.Equal(t, http.StatusInternalServerError, got.status)
	p := problemOf(t, got)
	assert.Empty(t, p.Code)
	assert.NotContains(t, got.body, "boom")
}

// TestKeyFormat: a key the API's format refuses is answered 400 with the
// key_invalid problem quoting the format's error; the handler does not run
// and nothing is claimed, so the same key, once the format takes it, runs.
func TestKeyFormat(t *testing.T) {
	var strict atomic.Bool
	strict.Store(true)
	errFormat := errors.New("keys are order- followed by a number")
	var seen atomic.Value
	h := &orders{}
	srv, _ := fixture(t, h, server.WithKeyFormat(func(key string) error {
		seen.Store(key)
		if strict.Load() && !strings.HasPrefix(key, "order-") {
			return errFormat
		}
		return nil
	}), server.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, err error) {
		if strings.Contains(r.Header.Get("Idempotency-Key"), "free") {
			assert.ErrorIs(t, err, server.ErrInvalidKey)
			assert.ErrorIs(t, err, errFormat)
		}
		server.WriteProblem(w, r, err)
	}))

	got := post(t, srv.URL, "free-form", "x")
	assert.Equal(t, http.StatusBadRequest, got.status)
	p := problemOf(t, got)
	assert.Equal(t, "key_invalid", p.Code)
	assert.True(t, strings.HasSuffix(p.Type, "#ErrInvalidKey"), p.Type)
	assert.Contains(t, p.Detail, errFormat.Error())
	assert.Empty(t, got.header.Get("Idempotency-Key"), "a refused key is not echoed")
	assert.Equal(t, int64(0), h.executions.Load(), "the handler ran")

	assert.Equal(t, http.StatusCreated, post(t, srv.URL, `"order-1"`, "x").status)
	assert.Equal(t, "order-1", seen.Load(), "the format sees the key unquoted")

	strict.Store(false)
	got = post(t, srv.URL, "free-form", "x")
	assert.Equal(t, http.StatusCreated, got.status, "the refused key was left claimed")
	assert.Empty(t, got.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(2), h.executions.Load())
}
