package idempotency_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
)

// bodyRecorder answers with the steps of a script and records each
// request's body, Content-Length and transfer encoding.
type bodyRecorder struct {
	*script
	mu      sync.Mutex
	bodies  []string
	lengths []int64
	chunked []bool
}

func (b *bodyRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.bodies = append(b.bodies, string(body))
	b.lengths = append(b.lengths, r.ContentLength)
	b.chunked = append(b.chunked, len(r.TransferEncoding) > 0)
	b.mu.Unlock()
	b.script.ServeHTTP(w, r)
}

func (b *bodyRecorder) seen() (bodies []string, lengths []int64, chunked []bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.bodies...), append([]int64(nil), b.lengths...), append([]bool(nil), b.chunked...)
}

func TestBufferedBodyReplayed(t *testing.T) {
	rec := &bodyRecorder{script: newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))}
	srv := newServer(t, rec)
	c := newClient(t, srv)
	payload := strings.Repeat("p", 3000)

	resp, err := c.Do(post(t, t.Context(), srv.URL, payload))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, outcome(t, resp).Attempts)
	bodies, lengths, chunked := rec.seen()
	assert.Equal(t, []string{payload, payload}, bodies)
	assert.Equal(t, []int64{3000, 3000}, lengths, "Content-Length")
	assert.Equal(t, []bool{false, false}, chunked, "chunked")
}

func TestEmptyBody(t *testing.T) {
	rec := &bodyRecorder{script: newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))}
	srv := newServer(t, rec)
	c := newClient(t, srv)

	resp, err := c.Do(post(t, t.Context(), srv.URL, ""))
	require.NoError(t, err)
	resp.Body.Close()
	bodies, lengths, _ := rec.seen()
	assert.Equal(t, []string{"", ""}, bodies)
	assert.Equal(t, []int64{0, 0}, lengths)
}

func TestGetBodyReplayed(t *testing.T) {
	// The lost response comes first, on a new connection: net/http itself
	// resends a keyed request whose response was lost on a reused one.
	rec := &bodyRecorder{script: newScript(lost, status(http.StatusServiceUnavailable), status(http.StatusCreated))}
	srv := newServer(t, rec)
	c := newClient(t, srv, idempotency.WithMaxBufferedBody(0))
	const payload = `{"amount":10}`
	req := post(t, t.Context(), srv.URL, payload)
	var calls atomic.Int64
	req.GetBody = func() (io.ReadCloser, error) {
		calls.Add(1)
		return io.NopCloser(strings.NewReader(payload)), nil
	}
	req.ContentLength = int64(len(payload))

	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 3, outcome(t, resp).Attempts)
	bodies, _, _ := rec.seen()
	assert.Equal(t, []string{payload, payload, payload}, bodies)
	assert.EqualValues(t, 2, calls.Load(), "GetBody calls")
}

func TestGetBodyFails(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated)))
	c := newClient(t, srv)
	req := post(t, t.Context(), srv.URL, "x")
	gone := errors.New("file is gone")
	req.GetBody = func() (io.ReadCloser, error) { return nil, gone }

	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	o := outcome(t, resp)
	assert.Equal(t, 1, o.Attempts)
	assert.ErrorIs(t, o.Stopped, idempotency.ErrBodyNotReplayable)
	assert.ErrorIs(t, o.Stopped, gone)
}

func TestBodyNotReplayable(t *testing.T) {
	payload := strings.Repeat("b", 1024)
	t.Run("status", func(t *testing.T) {
		rec := &bodyRecorder{script: newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))}
		srv := newServer(t, rec)
		c := newClient(t, srv, idempotency.WithMaxBufferedBody(16))
		body := &closeTracker{Reader: strings.NewReader(payload)}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
		require.NoError(t, err)

		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		o := outcome(t, resp)
		assert.Equal(t, 1, o.Attempts)
		assert.ErrorIs(t, o.Stopped, idempotency.ErrBodyNotReplayable)
		bodies, _, chunked := rec.seen()
		assert.Equal(t, []string{payload}, bodies, "the body is sent whole, once")
		assert.Equal(t, []bool{true}, chunked)
		assert.True(t, body.closed.Load(), "body closed")
	})
	t.Run("lost response", func(t *testing.T) {
		s := newScript(lost, status(http.StatusCreated))
		srv := newServer(t, s)
		c := newClient(t, srv, idempotency.WithMaxBufferedBody(16))

		_, err := c.Do(post(t, t.Context(), srv.URL, payload))
		assert.ErrorIs(t, err, idempotency.ErrBodyNotReplayable)
		var re *idempotency.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, 1, re.Attempts)
		assert.EqualValues(t, 1, s.hits.Load())
	})
}

func TestBodyAtBufferLimit(t *testing.T) {
	rec := &bodyRecorder{script: newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))}
	srv := newServer(t, rec)
	c := newClient(t, srv, idempotency.WithMaxBufferedBody(16))
	payload := strings.Repeat("x", 16)

	resp, err := c.Do(post(t, t.Context(), srv.URL, payload))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, outcome(t, resp).Attempts)
	bodies, _, _ := rec.seen()
	assert.Equal(t, []string{payload, payload}, bodies)
}

func TestBodyReadError(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusCreated)))
	c := newClient(t, srv)
	broken := errors.New("disk on fire")
	body := &closeTracker{Reader: io.MultiReader(strings.NewReader("abc"), errReader{broken})}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
	require.NoError(t, err)

	_, err = c.Do(req)
	assert.ErrorIs(t, err, broken)
	assert.True(t, body.closed.Load())
}

func TestBodyContentLengthMismatch(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusCreated)))
	c := newClient(t, srv)
	req := post(t, t.Context(), srv.URL, "abc")
	req.ContentLength = 10

	_, err := c.Do(req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ContentLength")
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestRedirect307ReplaysBody(t *testing.T) {
	got := make(chan string, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, "/b", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/b", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- r.Header.Get(hdrKey) + " " + string(body)
		w.WriteHeader(http.StatusCreated)
	})
	srv := newServer(t, mux)
	c := newClient(t, srv)

	resp, err := c.Do(post(t, t.Context(), srv.URL+"/a", "payload"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, outcome(t, resp).Key+" payload", <-got)
}

func TestHugeSizes(t *testing.T) {
	const payload = "payload"
	tests := []struct {
		name          string
		limit         int64
		contentLength int64
		wantErr       bool
	}{
		{"largest buffer limit", math.MaxInt64, int64(len(payload)), false},
		{"largest buffer limit, unknown length", math.MaxInt64, -1, false},
		{"largest ContentLength", 1 << 20, math.MaxInt64, true},
		{"largest buffer limit and ContentLength", math.MaxInt64, math.MaxInt64, true},
		{"ContentLength of a terabyte", math.MaxInt64, 1 << 40, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &bodyRecorder{script: newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))}
			srv := newServer(t, rec)
			c := newClient(t, srv, idempotency.WithMaxBufferedBody(tt.limit))
			req := post(t, t.Context(), srv.URL, payload)
			req.ContentLength = tt.contentLength

			resp, err := c.Do(req)
			if tt.wantErr {
				// The body is shorter than it says: refused before any
				// attempt.
				require.Error(t, err)
				assert.Contains(t, err.Error(), "ContentLength")
				assert.Zero(t, rec.hits.Load(), "requests sent")
				return
			}
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			bodies, _, _ := rec.seen()
			assert.Equal(t, []string{payload, payload}, bodies)
		})
	}
}

func TestHugeOptions(t *testing.T) {
	huge := []idempotency.Option{
		idempotency.WithMaxAttempts(math.MaxInt),
		idempotency.WithAttemptTimeout(math.MaxInt64),
		idempotency.WithMaxRetryAfter(math.MaxInt64),
		idempotency.WithBackoff(math.MaxInt64, math.MaxInt64),
		idempotency.WithBudget(idempotency.NewBudget(math.MaxInt)),
		idempotency.WithMaxBufferedBody(math.MaxInt64),
	}
	t.Run("Retry-After 0", func(t *testing.T) {
		s := newScript(status(http.StatusServiceUnavailable, "Retry-After", "0"), status(http.StatusCreated))
		srv := newServer(t, s)
		c := newClient(t, srv, huge...)

		resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, 2, outcome(t, resp).Attempts)
	})
	t.Run("Retry-After past the deadline", func(t *testing.T) {
		s := newScript(status(http.StatusServiceUnavailable, "Retry-After", "99999999999999999999999"))
		srv := newServer(t, s)
		c := newClient(t, srv, huge...)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()

		resp, err := c.Do(post(t, ctx, srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.ErrorIs(t, outcome(t, resp).Stopped, idempotency.ErrDeadline)
	})
}

func TestStalledRequestBody(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("the first bytes, then nothing"))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, pr)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := c.Do(req)
		done <- err
	}()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		pw.CloseWithError(errors.New("test over"))
		t.Fatal("Do() still reading a stalled body long after the context's deadline")
	}
	assert.Zero(t, s.hits.Load(), "requests sent")
}
