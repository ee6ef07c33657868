package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

// newServer starts a loopback server that the test closes. configure, if
// given, is called before it starts.
func newServer(t *testing.T, h http.Handler, configure ...func(*http.Server)) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	// Lost responses and refused handshakes are the point of some tests.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	for _, f := range configure {
		f(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// newClient returns a Client that talks to srv with short waits.
func newClient(tb testing.TB, srv *httptest.Server, opts ...idempotency.Option) *idempotency.Client {
	tb.Helper()
	base := []idempotency.Option{
		idempotency.WithHTTPClient(srv.Client()),
		idempotency.WithBackoff(time.Millisecond, 5*time.Millisecond),
	}
	return clienttest.New(tb, append(base, opts...)...)
}

// outcome returns the Outcome of resp, failing the test if there is none.
func outcome(t *testing.T, resp *http.Response) idempotency.Outcome {
	t.Helper()
	o, ok := idempotency.OutcomeOf(resp)
	require.True(t, ok, "OutcomeOf() ok = false, want true")
	return o
}

// readAll reads and closes resp's body.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// loseResponse closes the connection of w without answering: the handler
// has run, the response never arrives.
func loseResponse(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// keyServer is an endpoint that honours idempotency keys: it runs the
// operation once per key, stores its response and replays it for the same
// key. Its first lose responses are lost after the operation ran, and the
// following delay ones are held until the client gives up on them.
type keyServer struct {
	lose  int
	delay int

	mu         sync.Mutex
	attempts   int
	executions int
	keys       []string // one per attempt
	bodies     []string // one per attempt
	stored     map[string]string
}

func (s *keyServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get(hdrKey)

	s.mu.Lock()
	s.attempts++
	n := s.attempts
	s.keys = append(s.keys, key)
	s.bodies = append(s.bodies, string(body))
	if s.stored == nil {
		s.stored = make(map[string]string)
	}
	stored, replayed := s.stored[key]
	if !replayed || key == "" {
		s.executions++
		stored = fmt.Sprintf(`{"order":%d}`, s.executions)
		s.stored[key] = stored
	}
	s.mu.Unlock()

	switch {
	case n <= s.lose:
		loseResponse(w)
		return
	case n <= s.lose+s.delay:
		<-r.Context().Done()
		return
	}
	if replayed {
		w.Header().Set(hdrReplayed, "true")
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, stored)
}

func (s *keyServer) stats() (attempts, executions int, keys []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts, s.executions, append([]string(nil), s.keys...)
}

// script answers the requests it gets with the given handlers in turn, the
// last one for every request after them, and counts the requests and the
// keys they carried.
type script struct {
	steps []http.HandlerFunc
	hits  atomic.Int64

	mu   sync.Mutex
	keys []string
}

func newScript(steps ...http.HandlerFunc) *script {
	return &script{steps: steps}
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	n := int(s.hits.Add(1))
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get(hdrKey))
	step := s.steps[min(n, len(s.steps))-1]
	s.mu.Unlock()
	step(w, r)
}

// set replaces step i.
func (s *script) set(i int, h http.HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps[i] = h
}

func (s *script) keysSeen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// status answers with code and the given header pairs.
func status(code int, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d", code)
	}
}

func lost(w http.ResponseWriter, _ *http.Request) { loseResponse(w) }

// post makes a POST request with a body that has no GetBody.
func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, io.NopCloser(strings.NewReader(body)))
	require.NoError(t, err)
	return req
}

// closeTracker is a request body that records whether it was closed.
type closeTracker struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeTracker) Close() error {
	c.closed.Store(true)
	return nil
}

// retries collects the EventRetried events of a Client's observer.
type retries struct {
	mu    sync.Mutex
	infos []idempotency.Event
}

func (r *retries) hook(_ context.Context, e idempotency.Event) {
	if e.Kind != idempotency.EventRetried {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.infos = append(r.infos, e)
}

func (r *retries) all() []idempotency.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]idempotency.Event(nil), r.infos...)
}

// onRetry is an observer that calls fn on each EventRetried.
func onRetry(fn func()) idempotency.Option {
	return idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		if e.Kind == idempotency.EventRetried {
			fn()
		}
	})
}

// The headers of this module's own dialect, the zero idempotency.Dialect.
const (
	hdrKey      = "Idempotency-Key"
	hdrReplayed = "Idempotent-Replayed"
)
