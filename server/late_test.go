package server_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
)

// gated is a Store whose Complete fails until the gate opens, as a store
// that is down for a while would.
type gated struct {
	engine.Store
	open      chan struct{}
	once      sync.Once
	openAfter int32 // if positive, the gate opens after this many Completes
	calls     atomic.Int32
}

func newGated(t *testing.T) *gated {
	t.Helper()
	store, _ := faulty(t)
	g := &gated{Store: store, open: make(chan struct{})}
	t.Cleanup(g.unblock)
	return g
}

func (g *gated) unblock() { g.once.Do(func() { close(g.open) }) }

func (g *gated) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if n := g.calls.Add(1); g.openAfter > 0 && n > g.openAfter {
		g.unblock()
	}
	select {
	case <-g.open:
		return g.Store.Complete(ctx, id, token, resp, ttl)
	default:
		return errFlaky
	}
}

// oneConn is a client that keeps one connection to the server and says
// whether each request reused it.
func oneConn(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func do(t *testing.T, c *http.Client, method, url, key string) (reply, bool) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader("x"))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	var reused bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	resp, err := c.Do(req)
	require.NoError(t, err, "%s %s while the store is down", method, url)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}, reused
}

// TestLateCompleteHoldsNothing: a Complete that fails for longer than the
// store timeout goes on in the background. Neither the client's answer nor
// its next request on the same keep-alive connection waits for the store,
// whatever wraps the middleware; once the store is back, a retry gets the
// response replayed, and the request never ran twice.
func TestLateCompleteHoldsNothing(t *testing.T) {
	noFlush := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Hides Flush and Unwrap: the answer leaves when the
			// handler returns.
			h.ServeHTTP(struct{ http.ResponseWriter }{w}, r)
		})
	}
	timeout := func(h http.Handler) http.Handler {
		return http.TimeoutHandler(h, time.Second, "timed out")
	}
	for _, tc := range []struct {
		name string
		wrap func(http.Handler) http.Handler
	}{
		{"plain", func(h http.Handler) http.Handler { return h }},
		{"writer that cannot flush", noFlush},
		{"TimeoutHandler", timeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newGated(t)
			h := &orders{}
			mw, err := server.New(store, server.WithConfig(engine.Config{StoreTimeout: 50 * time.Millisecond, Lease: time.Minute}))
			require.NoError(t, err)
			t.Cleanup(func() { shutdown(t, mw) })
			mux := http.NewServeMux()
			mux.Handle("POST /", h)
			mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pong") })
			srv := startServer(t, tc.wrap(mw.Handler(mux)))
			c := oneConn(t)

			first, _ := do(t, c, http.MethodPost, srv.URL, "k")
			assert.Equal(t, http.StatusCreated, first.status, "the answer does not wait for the store")
			ping, reused := do(t, c, http.MethodGet, srv.URL+"/ping", "")
			assert.Equal(t, "pong", ping.body, "the next request does not wait for the store")
			assert.True(t, reused, "the same connection served both")
			again, _ := do(t, c, http.MethodPost, srv.URL, "k")
			assert.Equal(t, http.StatusConflict, again.status, "until it is stored, the key is in flight")

			store.unblock()
			waitFor(t, "the response to be stored", func() bool {
				again, _ = do(t, c, http.MethodPost, srv.URL, "k")
				return again.status != http.StatusConflict
			})
			assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			assert.Equal(t, first.body, again.body)
			assert.Equal(t, int64(1), h.executions.Load())
		})
	}
}

// TestLateCompleteWhateverTheTTL: the late Complete goes on for a lease
// whatever the TTL. Here the TTL is the lease (a TTL under the default lease
// makes it so) and the handler, its lease renewed, runs longer than the TTL
// after its claim; the store is down when it answers. Once the store is
// back, a retry gets the response replayed: the request did not run again.
func TestLateCompleteWhateverTheTTL(t *testing.T) {
	store := newGated(t)
	var executions atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		select {
		case <-time.After(600 * time.Millisecond): // work longer than the TTL
		case <-r.Context().Done():
			http.Error(w, "lease lost", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order 1")
	})
	mw, err := server.New(store, server.WithConfig(engine.Config{TTL: 400 * time.Millisecond, StoreTimeout: 50 * time.Millisecond}))
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, mw) })
	srv := startServer(t, mw.Handler(h))
	c := oneConn(t)

	first, _ := do(t, c, http.MethodPost, srv.URL, "k")
	require.Equal(t, http.StatusCreated, first.status, "the answer, sent while the store is down")
	store.unblock()
	var again reply
	waitFor(t, "the key to leave the in-flight state", func() bool {
		again, _ = do(t, c, http.MethodPost, srv.URL, "k")
		return again.status != http.StatusConflict
	})
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"), "the retry's answer is a replay")
	assert.Equal(t, "order 1", again.body)
	assert.Equal(t, int64(1), executions.Load(), "executions")
}

func shutdown(t *testing.T, mw *server.Middleware) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assert.NoError(t, mw.Shutdown(ctx), "Shutdown")
}

// TestHandlerWriteDeadlineNotSpent: a handler sets a write deadline and
// answers at once; the Complete takes longer than the deadline. The
// deadline is the handler's, not the store's: the client gets the answer.
func TestHandlerWriteDeadlineNotSpent(t *testing.T) {
	store, _ := faulty(t)
	store.Set(faultstore.Complete, faultstore.Fault{Delay: 400 * time.Millisecond})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("o", 4096))
	})
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{StoreTimeout: 2 * time.Second}))
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Len(t, got.body, 4096)
	assert.Equal(t, 1, store.Calls(faultstore.Complete))
}

// TestShutdown: Shutdown waits for a late Complete, gives it up at its
// context's deadline, and after it a late Complete runs on the request's
// goroutine on a connection that the answer closes.
func TestShutdown(t *testing.T) {
	t.Run("waits", func(t *testing.T) {
		store := newGated(t)
		h := &orders{}
		mw, err := server.New(store, server.WithConfig(engine.Config{StoreTimeout: 20 * time.Millisecond}))
		require.NoError(t, err)
		srv := startServer(t, mw.Handler(h))
		first := post(t, srv.URL, "k", "x")
		require.Equal(t, http.StatusCreated, first.status)
		srv.Close()
		done := make(chan error, 1)
		go func() { done <- mw.Shutdown(context.Background()) }()
		select {
		case err := <-done:
			t.Fatalf("Shutdown returned %v with a response still to store", err)
		default:
		}
		store.unblock()
		assert.NoError(t, recv(t, done, "Shutdown"))
		got, err := store.Claim(context.Background(), engine.ID{Key: "k"}, "", time.Minute, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, engine.Completed, got.Status, "stored before Shutdown returned")
	})
	t.Run("gives up", func(t *testing.T) {
		store := newGated(t)
		var logs syncBuffer
		mw, err := server.New(store, server.WithConfig(engine.Config{StoreTimeout: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
		require.NoError(t, err)
		srv := startServer(t, mw.Handler(&orders{}))
		require.Equal(t, http.StatusCreated, post(t, srv.URL, "k", "x").status)
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err = mw.Shutdown(ctx)
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "Shutdown() = %v, want DeadlineExceeded", err)
		assert.Contains(t, logs.String(), "Shutdown gave up")
		assert.NoError(t, mw.Shutdown(context.Background()), "a second Shutdown, with nothing left")
	})
	t.Run("after", func(t *testing.T) {
		store := newGated(t)
		// Past the store timeout's tries, a few late ones fail too.
		store.openAfter = 5
		h := &orders{}
		mw, err := server.New(store, server.WithConfig(engine.Config{StoreTimeout: 20 * time.Millisecond, Lease: time.Minute}))
		require.NoError(t, err)
		shutdown(t, mw)
		srv := startServer(t, mw.Handler(h))
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.True(t, resp.Close, "the answer closes its connection")
		var again reply
		waitFor(t, "the response to be stored", func() bool {
			again = post(t, srv.URL, "k", "x")
			return again.status != http.StatusConflict
		})
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, int64(1), h.executions.Load())
	})
}
