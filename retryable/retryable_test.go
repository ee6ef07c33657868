package retryable_test

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/incoming"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/wire"
	"github.com/idemkit/idempotency/retryable"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newRetryClient returns a go-retryablehttp client with short waits, not
// logging, protected if protect.
func newRetryClient(t *testing.T, protect bool) *retryablehttp.Client {
	t.Helper()
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.RetryWaitMin, rc.RetryWaitMax = time.Millisecond, 5*time.Millisecond
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	rc.HTTPClient = &http.Client{Transport: tr}
	if protect {
		require.NoError(t, retryable.Protect(rc))
	}
	return rc
}

// orders runs n orders through rc, to a service behind the middleware and
// a proxy that loses responses, and returns how many the service executed
// and how many answers the client got.
func orders(t *testing.T, rc *retryablehttp.Client, n int) (executed, answered int64) {
	t.Helper()
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	// Keys optional, so that the unprotected client's orders run too.
	mw, err := server.New(store, server.WithKeyOptional())
	require.NoError(t, err)
	var executions atomic.Int64
	upstream := httptest.NewUnstartedServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, executions.Add(1))
	})))
	upstream.Config.ErrorLog = log.New(io.Discard, "", 0)
	upstream.Start()
	t.Cleanup(upstream.Close)
	// A fifth of the responses lost after the order was made, a twentieth
	// of the requests reset before the service saw them.
	p, err := faultnet.Start(upstream.URL, faultnet.Config{DropRate: 0.2, ResetRate: 0.05, Seed: 21})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })

	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range n {
		wg.Go(func() {
			req, err := retryablehttp.NewRequestWithContext(t.Context(), http.MethodPost, p.URL()+"/orders",
				bytes.NewReader(fmt.Appendf(nil, `{"item":%d}`, i)))
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := rc.Do(req)
			if err != nil {
				return // retries ran out: the order may or may not exist
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusCreated {
				ok.Add(1)
			}
		})
		if i%8 == 7 {
			wg.Wait() // eight at a time
		}
	}
	wg.Wait()
	return executions.Load(), ok.Load()
}

// TestLossyNetwork: N orders through a lossy network, N executions.
func TestLossyNetwork(t *testing.T) {
	const n = 200
	t.Run("protected", func(t *testing.T) {
		rc := newRetryClient(t, true)
		rc.RetryMax = 10
		executed, answered := orders(t, rc, n)
		t.Logf("%d orders, %d answered, %d executions with Protect", n, answered, executed)
		assert.EqualValues(t, n, answered, "orders answered 201")
		assert.EqualValues(t, n, executed, "orders executed")
	})
	t.Run("unprotected", func(t *testing.T) {
		// The same client without Protect, to show what the test catches.
		rc := newRetryClient(t, false)
		rc.RetryMax = 10
		executed, _ := orders(t, rc, n)
		t.Logf("%d orders, %d executions without Protect", n, executed)
		assert.Greater(t, executed, int64(n), "orders executed without keys")
	})
}

// script answers with its steps in turn, the last one for every request
// after them, and records the key of each request.
type script struct {
	steps []http.HandlerFunc
	mu    sync.Mutex
	keys  []string
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	step := s.steps[min(len(s.keys), len(s.steps))-1]
	s.mu.Unlock()
	step(w, r)
}

func (s *script) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func status(code int, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
	}
}

func problem(code int, typ string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"type":%q}`, typ)
	}
}

func lost(w http.ResponseWriter, _ *http.Request) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

// TestDecisions: what a protected client retries, and with which key.
func TestDecisions(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		header   http.Header
		steps    []http.HandlerFunc
		requests int
		sameKey  bool
		noKey    bool
	}{
		{"lost, then created", http.MethodPost, nil, []http.HandlerFunc{lost, status(503), status(201)}, 3, true, false},
		{"the caller's key wins", http.MethodPost, http.Header{"idempotency-key": {"mine"}}, []http.HandlerFunc{lost, status(201)}, 2, true, false},
		{"PATCH keyed", http.MethodPatch, nil, []http.HandlerFunc{status(502), status(200)}, 2, true, false},
		{"PUT retried without a key", http.MethodPut, nil, []http.HandlerFunc{lost, status(200)}, 2, false, true},
		{"a method neither idempotent nor keyed: sent once", "LOCK", nil, []http.HandlerFunc{lost, status(200)}, 1, false, true},
		{"the same, answered 503: sent once", "LOCK", nil, []http.HandlerFunc{status(503), status(200)}, 1, false, true},
		{"business 409: sent once", http.MethodPost, nil, []http.HandlerFunc{problem(409, "https://api.example/email-taken"), status(201)}, 1, true, false},
		{"in-flight 409: retried", http.MethodPost, nil, []http.HandlerFunc{problem(409, wire.TypeInFlight), status(201)}, 2, true, false},
		{"409 with Retry-After: retried", http.MethodPost, nil, []http.HandlerFunc{status(409, "Retry-After", "0"), status(201)}, 2, true, false},
		{"outcome unknown: final", http.MethodPost, nil, []http.HandlerFunc{problem(409, wire.TypeOutcomeUnknown), status(201)}, 1, true, false},
		{"key mismatch: final", http.MethodPost, nil, []http.HandlerFunc{problem(422, wire.TypeKeyMismatch), status(201)}, 1, true, false},
		{"Stripe-Should-Retry: false", http.MethodPost, nil, []http.HandlerFunc{status(503, "Stripe-Should-Retry", "false"), status(201)}, 1, true, false},
		{"X-Should-Retry: true", http.MethodPost, nil, []http.HandlerFunc{status(400, "X-Should-Retry", "true"), status(201)}, 2, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &script{steps: tt.steps}
			srv := httptest.NewUnstartedServer(s)
			srv.Config.ErrorLog = log.New(io.Discard, "", 0)
			srv.Start()
			defer srv.Close()
			rc := newRetryClient(t, true)
			hreq, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL, bytes.NewReader([]byte("x")))
			require.NoError(t, err)
			for k, v := range tt.header {
				hreq.Header[k] = v
			}
			callers, before := hreq.Header, hreq.Header.Clone()
			req, err := retryablehttp.FromRequest(hreq)
			require.NoError(t, err)

			resp, err := rc.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			keys := s.seen()
			assert.Len(t, keys, tt.requests, "requests")
			for _, k := range keys {
				if tt.noKey {
					assert.Empty(t, k)
				} else {
					assert.NotEmpty(t, k)
				}
				if tt.sameKey {
					assert.Equal(t, keys[0], k, "key of every attempt")
				}
			}
			for _, v := range tt.header {
				// The only header of a case is a key of the caller's.
				assert.Equal(t, v[0], keys[0], "the caller's key")
			}
			assert.Equal(t, before, callers, "the caller's header map")
		})
	}
}

// TestContextKey: a key carried in the context is the one sent.
func TestContextKey(t *testing.T) {
	s := &script{steps: []http.HandlerFunc{status(503), status(201)}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	rc := newRetryClient(t, true)
	req, err := retryablehttp.NewRequestWithContext(idempotency.ContextWithKey(t.Context(), "stored-key"),
		http.MethodPost, srv.URL, []byte("x"))
	require.NoError(t, err)
	resp, err := rc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"stored-key", "stored-key"}, s.seen())
}

func TestProtectRefuses(t *testing.T) {
	assert.Error(t, retryable.Protect(nil))
	rc := retryablehttp.NewClient()
	require.NoError(t, retryable.Protect(rc))
	assert.Error(t, retryable.Protect(rc), "Protect() twice")
}

// TestDerivedKey: inside a handler, the key is derived from the incoming
// key, as the Client derives it.
func TestDerivedKey(t *testing.T) {
	s := &script{steps: []http.HandlerFunc{status(503), status(201)}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	rc := newRetryClient(t, true)
	ctx := idempotency.ContextWithStep(incoming.NewContext(t.Context(), &incoming.Key{Scope: "t", Key: "in"}), "charge")
	want, ok := (&idempotency.Client{}).DerivedKey(ctx, "charge")
	require.True(t, ok)
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, srv.URL, []byte("x"))
	require.NoError(t, err)
	resp, err := rc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{want, want}, s.seen())
}

// TestUnkeyedPostNotRetried: a POST that went without a key (here because
// the hook that sets it was replaced after Protect) is sent once, whether
// its response is lost or says 503.
func TestUnkeyedPostNotRetried(t *testing.T) {
	for _, first := range []http.HandlerFunc{lost, status(503)} {
		s := &script{steps: []http.HandlerFunc{first, status(201)}}
		srv := httptest.NewUnstartedServer(s)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.Start()
		rc := newRetryClient(t, true)
		rc.RequestLogHook = nil
		req, err := retryablehttp.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, []byte("x"))
		require.NoError(t, err)
		resp, err := rc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		assert.Equal(t, []string{""}, s.seen(), "requests, and their keys")
		srv.Close()
	}
}

// TestDerivedKeySecret: with WithDerivedKeySecret, the derived key is the
// one a Client with the same secret derives, and not the one without.
func TestDerivedKeySecret(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	s := &script{steps: []http.HandlerFunc{status(503), status(201)}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	rc := newRetryClient(t, false)
	require.NoError(t, retryable.Protect(rc, retryable.WithDerivedKeySecret(secret)))
	ctx := idempotency.ContextWithStep(incoming.NewContext(t.Context(), &incoming.Key{Scope: "t", Key: "in"}), "charge")
	c, err := idempotency.NewClient(idempotency.WithDerivedKeySecret(secret))
	require.NoError(t, err)
	want, _ := c.DerivedKey(ctx, "charge")
	plain, _ := (&idempotency.Client{}).DerivedKey(ctx, "charge")
	require.NotEqual(t, plain, want)
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, srv.URL, []byte("x"))
	require.NoError(t, err)
	resp, err := rc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{want, want}, s.seen())

	err = retryable.Protect(retryablehttp.NewClient(), retryable.WithDerivedKeySecret([]byte("short")), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithDerivedKeySecret needs at least 16 bytes, got 5")
	assert.Contains(t, err.Error(), "option 1 is nil")
}
