package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// orders is a handler that creates an order per execution and counts them.
type orders struct {
	executions atomic.Int64
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	n := o.executions.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Not-Listed", "x")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"echo":%q}`, n, body)
}

// fixture starts an httptest server with the middleware in front of h.
func fixture(t *testing.T, h http.Handler, opts ...server.Option) (*httptest.Server, memstore.Store) {
	t.Helper()
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	return fixtureWith(t, store, h, opts...), store
}

func fixtureWith(t *testing.T, store engine.Store, h http.Handler, opts ...server.Option) *httptest.Server {
	t.Helper()
	mw, err := server.New(store, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, mw.Shutdown(ctx), "Shutdown")
	})
	return startServer(t, mw.Handler(h))
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// postAsync sends the request from a goroutine of its own, which must not
// fail the test: an error comes back as a reply with status -1.
func postAsync(url, key, body string) <-chan reply {
	out := make(chan reply, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			out <- reply{status: -1, body: err.Error()}
			return
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- reply{status: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			out <- reply{status: -1, body: err.Error()}
			return
		}
		out <- reply{resp.StatusCode, resp.Header, string(b)}
	}()
	return out
}

func assertProblem(t *testing.T, got reply, anchor string) {
	t.Helper()
	assert.Equal(t, "application/problem+json", got.header.Get("Content-Type"))
	var p struct {
		Type, Title, Detail, Code string
		Status                    int
	}
	require.NoError(t, json.Unmarshal([]byte(got.body), &p), "body %q", got.body)
	assert.True(t, strings.HasSuffix(p.Type, "#"+anchor), "problem type = %q, want ...#%s", p.Type, anchor)
	assert.Equal(t, got.status, p.Status)
	assert.NotEmpty(t, p.Title)
	assert.NotEmpty(t, p.Detail)
	if anchor == "ErrInvalidKey" {
		assert.Contains(t, []string{"key_invalid", "key_too_long"}, p.Code)
	} else {
		assert.Equal(t, problemCodes[anchor], p.Code, "code of %s", anchor)
	}
}

// problemCodes is the published code of each problem, by its type's anchor.
var problemCodes = map[string]string{
	"ErrMissingKey":       "key_missing",
	"ErrUnidentified":     "request_unidentified",
	"ErrBodyUnreadable":   "body_unreadable",
	"ErrBodyTooLarge":     "body_too_large",
	"ErrKeyMismatch":      "key_mismatch",
	"ErrInFlight":         "in_flight",
	"ErrStoreUnavailable": "store_unavailable",
}

// blocking is a handler that waits for release before answering.
type blocking struct {
	orders
	started chan struct{}
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{started: make(chan struct{}, 1000), release: make(chan struct{})}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-r.Context().Done():
		// The test ended early (startServer's cleanup cuts every
		// connection) or the client left: answer nothing.
		return
	}
	b.orders.ServeHTTP(w, r)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// syncBuffer collects log output written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(time.Millisecond)
	}
}

// recv receives from ch, or fails the test after a few seconds.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		require.FailNow(t, "timed out waiting for "+what)
		panic("unreachable")
	}
}

// startServer serves h on a loopback httptest server.
func startServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(func() {
		// Cut the connections first: a test that failed half-way may
		// leave a handler waiting on its client, and Close would wait
		// for it for ever.
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}
