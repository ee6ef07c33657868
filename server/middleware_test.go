package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
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
func fixture(t *testing.T, h http.Handler, opts ...server.Option) (*httptest.Server, *memstore.Store) {
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

func TestFirstRequestThenReplay(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	first := post(t, srv.URL+"/orders", "k1", `{"sku":"A"}`)
	require.Equal(t, http.StatusCreated, first.status)
	assert.Equal(t, "session=secret", first.header.Get("Set-Cookie"), "the first response is the handler's own")
	assert.Empty(t, first.header.Get("Idempotent-Replayed"))

	second := post(t, srv.URL+"/orders", "k1", `{"sku":"A"}`)
	assert.Equal(t, int64(1), h.executions.Load(), "executions")
	assert.Equal(t, first.status, second.status)
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "application/json", second.header.Get("Content-Type"))
	assert.Equal(t, "/orders/1", second.header.Get("Location"))
	assert.Empty(t, second.header.Get("Set-Cookie"), "Set-Cookie must never be replayed")
	assert.Empty(t, second.header.Get("X-Not-Listed"), "headers off the allow-list are not replayed")
	assert.Equal(t, strconv.Itoa(len(first.body)), second.header.Get("Content-Length"))
}

func TestQuotedKeyIsTheSameKey(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	first := post(t, srv.URL, "8e03978e-40d5-43e8-bc93-6894a57f9324", "x")
	second := post(t, srv.URL, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "x")
	assert.Equal(t, int64(1), h.executions.Load())
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
}

func TestKeyMismatch(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	post(t, srv.URL, "k", `{"amount":10}`)
	for _, tc := range []struct{ name, url, body string }{
		{"body", srv.URL, `{"amount":1000}`},
		{"path", srv.URL + "/other", `{"amount":10}`},
		{"query", srv.URL + "?x=1", `{"amount":10}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, tc.url, "k", tc.body)
			assert.Equal(t, http.StatusUnprocessableEntity, got.status)
			assertProblem(t, got, "ErrKeyMismatch")
		})
	}
	assert.Equal(t, int64(1), h.executions.Load())
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

func TestBadKeys(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	t.Run("missing", func(t *testing.T) {
		got := post(t, srv.URL, "", "x")
		assert.Equal(t, http.StatusBadRequest, got.status)
		assertProblem(t, got, "ErrMissingKey")
	})
	for _, tc := range []struct{ name, key string }{
		{"256 bytes", strings.Repeat("k", 256)},
		{"empty quoted", `""`},
		{"broken quoting", `"abc`},
		{"non-ASCII", "clé"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, srv.URL, tc.key, "x")
			assert.Equal(t, http.StatusBadRequest, got.status)
			assertProblem(t, got, "ErrInvalidKey")
		})
	}
	t.Run("255 bytes accepted", func(t *testing.T) {
		assert.Equal(t, http.StatusCreated, post(t, srv.URL, strings.Repeat("k", 255), "x").status)
	})
	// Go's client refuses to send control characters, so write the request
	// by hand.
	for _, tc := range []struct{ name, raw string }{
		{"control character", "Idempotency-Key: a\x01b\r\n"},
		{"empty", "Idempotency-Key: \r\n"},
		{"twice", "Idempotency-Key: a\r\nIdempotency-Key: b\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, http.StatusBadRequest, rawPost(t, srv.Listener.Addr().String(), tc.raw, "x"))
		})
	}
	assert.Equal(t, int64(1), h.executions.Load(), "only the 255-byte key ran")
}

func rawPost(t *testing.T, addr, headers, body string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s", len(body), headers, body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestBodyTooLarge(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithMaxBody(16))
	got := post(t, srv.URL, "k", strings.Repeat("x", 17))
	assert.Equal(t, http.StatusRequestEntityTooLarge, got.status)
	assertProblem(t, got, "ErrBodyTooLarge")

	// Without a Content-Length, the limit is found while reading.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader(strings.Repeat("x", 17))))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "k2")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	assert.Equal(t, int64(0), h.executions.Load(), "the handler must not run")
	assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k3", strings.Repeat("x", 16)).status)
}

func TestMethodsAndOptionalKey(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithKeyOptional())
	for range 2 {
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
	}
	post(t, srv.URL, "", "no key")
	post(t, srv.URL, "", "no key")
	assert.Equal(t, int64(4), h.executions.Load(), "GET and keyless POSTs pass through")

	h2 := &orders{}
	srv2, _ := fixture(t, h2, server.WithMethods("PUT"))
	post(t, srv2.URL, "", "POST is no longer protected")
	assert.Equal(t, int64(1), h2.executions.Load())
}

func TestCrossTenant(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	alice := post(t, srv.URL, "shared", "x", "Authorization", "Bearer alice")
	bob := post(t, srv.URL, "shared", "x", "Authorization", "Bearer bob")
	assert.Equal(t, int64(2), h.executions.Load(), "each tenant's request runs")
	assert.NotEqual(t, alice.body, bob.body)
	assert.Empty(t, bob.header.Get("Idempotent-Replayed"))
	again := post(t, srv.URL, "shared", "x", "Authorization", "Bearer alice")
	assert.Equal(t, alice.body, again.body, "alice gets her own replay")
}

func TestScopeFromApplication(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithScope(func(r *http.Request) (string, error) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "" {
			return "", errors.New("no tenant")
		}
		return "tenant:" + tenant, nil
	}))
	post(t, srv.URL, "k", "x", "X-Tenant", "a")
	post(t, srv.URL, "k", "x", "X-Tenant", "b")
	assert.Equal(t, int64(2), h.executions.Load())
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusBadRequest, got.status)
	assertProblem(t, got, "ErrUnidentified")
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

func TestInFlight(t *testing.T) {
	h := newBlocking()
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Lease: time.Minute}))
	first := postAsync(srv.URL, "k", "x")
	<-h.started
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusConflict, got.status)
	assertProblem(t, got, "ErrInFlight")
	ra, err := strconv.Atoi(got.header.Get("Retry-After"))
	assert.NoError(t, err)
	assert.True(t, ra >= 1 && ra <= 60, "Retry-After = %d, want 1..60", ra)
	assert.Equal(t, http.StatusUnprocessableEntity, post(t, srv.URL, "k", "other").status)
	close(h.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, int64(1), h.executions.Load())
}

func TestConcurrentIdentical(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			h := newBlocking()
			opts := []server.Option{}
			if wait {
				opts = append(opts, server.WithConfig(engine.Config{Wait: 30 * time.Second}))
			}
			srv, _ := fixture(t, h, opts...)
			const n = 200
			tr := &http.Transport{MaxIdleConnsPerHost: n}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			replies := make(chan reply, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("same"))
					req.Header.Set("Idempotency-Key", "one")
					resp, err := client.Do(req)
					if err != nil {
						replies <- reply{status: -1, body: err.Error()}
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					replies <- reply{resp.StatusCode, resp.Header, string(b)}
				})
			}
			<-h.started
			if !wait {
				// Let the original finish only once every duplicate
				// has been refused.
				for range n - 1 {
					r := <-replies
					assert.Equal(t, http.StatusConflict, r.status, r.body)
				}
				close(h.release)
				wg.Wait()
				assert.Equal(t, http.StatusCreated, (<-replies).status)
			} else {
				close(h.release)
				wg.Wait()
				close(replies)
				var first string
				for r := range replies {
					assert.Equal(t, http.StatusCreated, r.status, r.body)
					if first == "" {
						first = r.body
					}
					assert.Equal(t, first, r.body, "every waiter gets the original's response")
				}
			}
			assert.Equal(t, int64(1), h.executions.Load(), "executions")
		})
	}
}

func TestFailuresReleaseTheKey(t *testing.T) {
	var calls atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusInternalServerError)
		case 2:
			w.WriteHeader(http.StatusTooManyRequests)
		case 3:
			panic("boom")
		default:
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "made")
		}
	})
	var logs bytes.Buffer
	var mu sync.Mutex
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(mw.Handler(h))
	srv.Config.ErrorLog = log.New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), "", 0)
	srv.Start()
	defer srv.Close()

	assert.Equal(t, http.StatusInternalServerError, post(t, srv.URL, "k", "x").status)
	assert.Equal(t, http.StatusTooManyRequests, post(t, srv.URL, "k", "x").status)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	// A fresh connection: net/http itself retries a keyed request that
	// fails on a reused one.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, err = fresh.Do(req)
	assert.Error(t, err, "a panicking handler's connection is dropped by the server")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "made", got.body)
	again := post(t, srv.URL, "k", "x")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(4), calls.Load())
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, logs.String(), "panic serving", "the panic reaches the server's recovery")
	assert.Contains(t, logs.String(), "boom")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestStoreStatusOption(t *testing.T) {
	var calls atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	})
	srv, _ := fixture(t, h, server.WithKeep(func(int) bool { return true }))
	post(t, srv.URL, "k", "x")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusBadGateway, got.status)
	assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), calls.Load())
}

// failing is a Store whose every operation fails.
type failing struct{ engine.Store }

var errDown = errors.New("store down")

func (failing) Claim(context.Context, engine.ID, string, time.Duration, time.Duration) (engine.Claim, error) {
	return engine.Claim{}, errDown
}

func TestStoreFailure(t *testing.T) {
	t.Run("fail closed", func(t *testing.T) {
		h := &orders{}
		var got error
		srv := fixtureWith(t, failing{}, h, server.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			server.WriteProblem(w, r, err)
		}))
		resp := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusServiceUnavailable, resp.status)
		assertProblem(t, resp, "ErrStoreUnavailable")
		assert.Equal(t, "1", resp.header.Get("Retry-After"))
		assert.NotContains(t, resp.body, "store down", "the store's error is not shown to clients")
		assert.ErrorIs(t, got, engine.ErrStoreUnavailable)
		assert.ErrorIs(t, got, errDown)
		assert.Equal(t, int64(0), h.executions.Load(), "the handler must not run unprotected")
	})
	t.Run("fail open", func(t *testing.T) {
		h := &orders{}
		srv := fixtureWith(t, failing{}, h, server.WithConfig(engine.Config{FailOpen: true}))
		resp := post(t, srv.URL, "k", "body")
		assert.Equal(t, http.StatusCreated, resp.status)
		assert.Contains(t, resp.body, `"echo":"body"`, "the handler reads the body")
		assert.Equal(t, int64(1), h.executions.Load())
	})
}

func TestLargeResponseRunsOnce(t *testing.T) {
	var calls atomic.Int64
	big := strings.Repeat("z", 64<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Location", "/orders/big")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, big)
	})
	srv, _ := fixture(t, h, server.WithMaxStored(1024))
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, first.status)
	assert.Equal(t, big, first.body, "the client gets the whole response")
	// Too large to keep, it went out as it was written, maybe before the
	// exchange was stored.
	var second reply
	waitFor(t, "the exchange to be stored", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, int64(1), calls.Load(), "a response too large to store must not make the request run twice")
	assert.Equal(t, http.StatusCreated, second.status)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "true", second.header.Get("Idempotent-Body-Omitted"))
	assert.Equal(t, "/orders/big", second.header.Get("Location"))
	assert.Empty(t, second.body)
}

func TestStreamingHandler(t *testing.T) {
	var calls, flushErrors atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "event %d\n", i)
			if http.NewResponseController(w).Flush() != nil {
				flushErrors.Add(1)
			}
		}
	})
	srv, _ := fixture(t, h)
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, "event 0\nevent 1\nevent 2\n", first.body)
	assert.Zero(t, flushErrors.Load(), "flush errors")
	// The client may have the whole stream before the exchange is stored.
	var second reply
	waitFor(t, "the streamed exchange to be stored", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, http.StatusOK, second.status)
	assert.Equal(t, "true", second.header.Get("Idempotent-Body-Omitted"))
	assert.Equal(t, "text/event-stream", second.header.Get("Content-Type"))
	assert.Equal(t, int64(1), calls.Load())
}

func TestLeaseFromContext(t *testing.T) {
	leases := make(chan engine.Lease, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, ok := engine.LeaseFromContext(r.Context())
		if ok {
			leases <- l
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv, _ := fixture(t, h, server.WithScope(func(*http.Request) (string, error) { return "acme", nil }))
	post(t, srv.URL, `"quoted-key"`, "x")
	l := <-leases
	assert.Equal(t, "acme", l.Scope)
	assert.Equal(t, "quoted-key", l.Key)
	assert.Positive(t, int64(l.Token))
	_, ok := engine.LeaseFromContext(context.Background())
	assert.False(t, ok)
}

// TestLeaseRenewed shows that a handler that outlives its lease keeps it:
// duplicates sent over several lease lengths are refused, never run.
func TestLeaseRenewed(t *testing.T) {
	// Long enough that a renewal delayed by a busy machine still comes
	// before the lease's end.
	const lease = time.Second
	h := newBlocking()
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Lease: lease}))
	first := postAsync(srv.URL, "k", "x")
	<-h.started
	// A duplicate that ran would block in the handler: give up on it
	// rather than hang.
	client := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	for n := 0; time.Since(start) < 2*lease || n < 3; n++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := client.Do(req)
		require.NoError(t, err, "a duplicate ran the handler after %v", time.Since(start))
		resp.Body.Close()
		require.Equal(t, http.StatusConflict, resp.StatusCode)
	}
	close(h.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, int64(1), h.executions.Load())
}

// losing is a store whose Extend reports the lease lost.
type losing struct{ *memstore.Store }

func (losing) Extend(context.Context, engine.ID, engine.Token, time.Duration) error {
	return fmt.Errorf("losing: %w", engine.ErrLeaseLost)
}

func TestLeaseLostCancelsHandler(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	causes := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		causes <- context.Cause(r.Context())
		w.WriteHeader(http.StatusCreated)
	})
	// A lease long enough that a Claim slowed by a busy machine still
	// leaves the handler time to start; the first renewal, after a third
	// of it, finds the lease lost.
	srv := fixtureWith(t, losing{store}, h, server.WithConfig(engine.Config{Lease: 600 * time.Millisecond}))
	post(t, srv.URL, "k", "x")
	assert.ErrorIs(t, recv(t, causes, "the handler's cancellation"), engine.ErrLeaseLost)
}

// binding is a Store that hands the handler a value through Bind.
type binding struct{ *memstore.Store }

type bound struct{}

func (binding) Bind(ctx context.Context, id engine.ID, tok engine.Token) context.Context {
	return context.WithValue(ctx, bound{}, id.Key+"#"+strconv.FormatInt(int64(tok), 10))
}

func TestBinder(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	got := make(chan any, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Context().Value(bound{})
	})
	srv := fixtureWith(t, binding{store}, h)
	post(t, srv.URL, "k", "x")
	assert.Equal(t, "k#1", <-got)
}

// TestClientGoneStillStored: the client disconnects while the handler runs;
// the response is stored anyway, so the retry gets the replay.
func TestClientGoneStillStored(t *testing.T) {
	h := newBlocking()
	gone := make(chan struct{})
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.started <- struct{}{}
		<-r.Context().Done() // the client has gone
		close(gone)
		h.orders.ServeHTTP(w, r)
	})
	srv, _ := fixture(t, inner)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-h.started
	cancel()
	assert.Error(t, <-errc)
	<-gone
	// The handler finishes after the disconnect; poll until its response
	// is stored.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := post(t, srv.URL, "k", "x")
		if got.status == http.StatusCreated {
			assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
			break
		}
		require.Equal(t, http.StatusConflict, got.status)
		require.True(t, time.Now().Before(deadline), "the response was never stored")
	}
	assert.Equal(t, int64(1), h.executions.Load())
}

func TestNoContentReplay(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv, _ := fixture(t, h)
	post(t, srv.URL, "k", "x")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusNoContent, got.status)
	assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
	assert.Empty(t, got.body)
}

// uncommitted is a transactional store whose Complete reports the
// handler's effects rolled back.
type uncommitted struct{ *memstore.Store }

func (uncommitted) Bind(ctx context.Context, _ engine.ID, _ engine.Token) context.Context { return ctx }

func (s uncommitted) Complete(ctx context.Context, id engine.ID, tok engine.Token, _ *engine.Response, _ time.Duration) error {
	s.Store.Release(ctx, id, tok)
	return fmt.Errorf("uncommitted: %w", engine.ErrNotCommitted)
}

func TestNotCommittedAnswers503(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			store, err := memstore.New()
			require.NoError(t, err)
			defer store.Close()
			h := &orders{}
			var opts []server.Option
			if failOpen {
				opts = append(opts, server.WithConfig(engine.Config{FailOpen: true}))
			}
			srv := fixtureWith(t, uncommitted{store}, h, opts...)
			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, http.StatusServiceUnavailable, got.status, "the handler's response must not reach the client")
			assertProblem(t, got, "ErrStoreUnavailable")
			assert.Empty(t, got.header.Get("Location"), "no header of the handler's")
			assert.Empty(t, got.header.Get("Set-Cookie"), "no header of the handler's")
			assert.Equal(t, int64(1), h.executions.Load(), "the handler runs once, even failing open")
		})
	}
}

// blind is a store that cannot see the fingerprint of a request in flight.
type blind struct{ *memstore.Store }

func (s blind) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if c.Status == engine.InFlight {
		c.Fingerprint = ""
	}
	return c, err
}

func TestInFlightUnknownFingerprint(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	h := newBlocking()
	srv := fixtureWith(t, blind{store}, h)
	first := postAsync(srv.URL, "k", "x")
	<-h.started
	assert.Equal(t, http.StatusConflict, post(t, srv.URL, "k", "other body").status,
		"with the original's fingerprint unknown, a duplicate is in flight, not a mismatch")
	close(h.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, http.StatusUnprocessableEntity, post(t, srv.URL, "k", "other body").status)
}

func TestHijackingHandler(t *testing.T) {
	var calls atomic.Int64
	var logs bytes.Buffer
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		rw.Flush()
	})
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Logger: logger}))
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusAccepted, first.status)
	assert.Equal(t, "ok", first.body)
	// The client has its answer as soon as the handler wrote it on the
	// hijacked connection, maybe before the exchange is stored.
	var second reply
	waitFor(t, "the hijacked exchange to be stored", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, int64(1), calls.Load(), "a hijacked exchange still runs once")
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "true", second.header.Get("Idempotent-Body-Omitted"))
	// The line is logged as the exchange is stored, which may be after
	// the replay above was answered: wait for it.
	waitFor(t, "the hijacked exchange to be logged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "how=hijacked")
	})
}
