package server_test

import (
	"bufio"
	"bytes"
	"context"
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

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

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

func faulty(t *testing.T) (*faultstore.Store, *memstore.Store) {
	t.Helper()
	mem, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	return faultstore.New(mem), mem
}

var errFlaky = errors.New("store timed out")

// TestLeaseEndsWhenRenewalFails: Extend keeps failing with an ordinary error.
// The handler is cancelled before its lease can be taken over, the retry that
// takes it over runs alone, and the first holder's late answer changes
// nothing in the record.
func TestLeaseEndsWhenRenewalFails(t *testing.T) {
	store, _ := faulty(t)
	store.Set(faultstore.Extend, faultstore.Fault{Err: errFlaky})
	const lease = 300 * time.Millisecond

	var (
		calls, effects atomic.Int64
		firstCtx       atomic.Value // the first handler's context
		firstDone      atomic.Bool  // when the second began
	)
	start := time.Now()
	causes := make(chan error, 1)
	secondRan := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			firstCtx.Store(r.Context())
			<-r.Context().Done()
			causes <- context.Cause(r.Context())
			<-secondRan
			// A handler that answers anyway, late: its answer must not
			// become the record's.
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "first")
		default:
			firstDone.Store(firstCtx.Load().(context.Context).Err() != nil)
			if time.Since(start) < lease {
				// Too early: the first's lease, granted after start,
				// cannot have ended. (Measured from start, not from when
				// the first handler began: on a busy machine the store
				// grants the lease well before the handler runs.)
				effects.Add(100)
			}
			effects.Add(1)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "second")
			close(secondRan)
		}
	})
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: lease, StoreTimeout: 50 * time.Millisecond}))
	first := postAsync(srv.URL, "k", "x")

	cause := recv(t, causes, "the handler to be cancelled")
	assert.ErrorIs(t, cause, engine.ErrLeaseExpired)
	assert.ErrorIs(t, cause, engine.ErrLeaseLost)
	assert.ErrorIs(t, cause, errFlaky, "the cause carries the last renewal's error")

	// Retry until the lease has ended and the retry takes the key over.
	var second reply
	waitFor(t, "the retry to take the key over", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, http.StatusCreated, second.status)
	assert.Equal(t, "second", second.body)
	assert.True(t, firstDone.Load(), "the first handler was cancelled before the second began")

	recv(t, first, "the first answer")
	store.Clear(faultstore.Extend)
	replayed := post(t, srv.URL, "k", "x")
	assert.Equal(t, "second", replayed.body, "the late holder's Complete is refused: the record is the second's")
	assert.Equal(t, "true", replayed.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), effects.Load(), "one effect, and not before the first lease ended")
}

// TestStoreHangs: each Store operation in turn hangs (or is slower than the
// store timeout). The client is answered within the store timeout and a
// margin, and no handler runs unprotected.
func TestStoreHangs(t *testing.T) {
	const timeout = 200 * time.Millisecond
	const margin = time.Second // for a busy machine
	for _, tc := range []struct {
		op     faultstore.Op
		fault  faultstore.Fault
		status int // the handler's
		want   int // the client's
		runs   int64
	}{
		{faultstore.Claim, faultstore.Fault{Hang: true}, http.StatusCreated, http.StatusServiceUnavailable, 0},
		{faultstore.Claim, faultstore.Fault{Delay: time.Minute}, http.StatusCreated, http.StatusServiceUnavailable, 0},
		{faultstore.Complete, faultstore.Fault{Hang: true}, http.StatusCreated, http.StatusCreated, 1},
		{faultstore.Release, faultstore.Fault{Hang: true}, http.StatusInternalServerError, http.StatusInternalServerError, 1},
	} {
		t.Run(fmt.Sprintf("%s/%+v", tc.op, tc.fault), func(t *testing.T) {
			store, _ := faulty(t)
			store.Set(tc.op, tc.fault)
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(tc.status)
			})
			// A short lease: a response that could not be stored is
			// tried again for up to a lease length after it is sent.
			srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{StoreTimeout: timeout, Lease: time.Second}))
			client := &http.Client{Timeout: timeout + 5*time.Second}
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", "k")
			began := time.Now()
			resp, err := client.Do(req)
			require.NoError(t, err, "no answer")
			resp.Body.Close()
			took := time.Since(began)
			got := reply{resp.StatusCode, resp.Header, ""}
			assert.Equal(t, tc.want, got.status)
			assert.Less(t, took, timeout+margin, "answered after %v", took)
			assert.Equal(t, tc.runs, runs.Load(), "handler runs")
			if tc.want == http.StatusServiceUnavailable {
				assert.Equal(t, "application/problem+json", got.header.Get("Content-Type"))
				assert.Equal(t, "1", got.header.Get("Retry-After"))
			}
		})
	}
}

// TestExtendHangs: a renewal that hangs is given up at the lease's end, and
// the handler is cancelled then.
func TestExtendHangs(t *testing.T) {
	store, _ := faulty(t)
	store.Set(faultstore.Extend, faultstore.Fault{Hang: true})
	const lease = 300 * time.Millisecond
	causes := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		causes <- context.Cause(r.Context())
	})
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: lease, StoreTimeout: time.Minute}))
	began := time.Now()
	got := postAsync(srv.URL, "k", "x")
	assert.ErrorIs(t, recv(t, causes, "the handler to be cancelled"), engine.ErrLeaseExpired)
	assert.Less(t, time.Since(began), lease+time.Second)
	assert.Equal(t, http.StatusServiceUnavailable, recv(t, got, "the answer").status,
		"a handler that gave up unanswered is not answered 200")
}

// TestCompleteFails: Complete is retried within the store timeout; when it
// never succeeds the client still gets the response, and the key stays in
// flight, logged, rather than released.
func TestCompleteFails(t *testing.T) {
	t.Run("transient", func(t *testing.T) {
		store, _ := faulty(t)
		store.Set(faultstore.Complete, faultstore.Fault{Err: errFlaky, Times: 3})
		h := &orders{}
		srv := fixtureWith(t, store, h)
		first := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusCreated, first.status)
		assert.Equal(t, 4, store.Calls(faultstore.Complete), "Complete calls")
		again := post(t, srv.URL, "k", "x")
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, int64(1), h.executions.Load())
	})
	t.Run("answer lost", func(t *testing.T) {
		// The first Complete is stored but its answer lost; the retry
		// finds the lease gone, which ends the retries.
		store, _ := faulty(t)
		store.Set(faultstore.Complete, faultstore.Fault{ErrAfter: errFlaky, Times: 1})
		h := &orders{}
		srv := fixtureWith(t, store, h)
		first := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusCreated, first.status)
		assert.Equal(t, 2, store.Calls(faultstore.Complete))
		again := post(t, srv.URL, "k", "x")
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, int64(1), h.executions.Load())
	})
	t.Run("for good", func(t *testing.T) {
		store, _ := faulty(t)
		store.Set(faultstore.Complete, faultstore.Fault{Err: errFlaky})
		var logs syncBuffer
		h := &orders{}
		const lease = 500 * time.Millisecond
		srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{StoreTimeout: 100 * time.Millisecond, Lease: lease, Logger: slog.New(slog.NewTextHandler(&logs, nil))}),
			server.WithScope(func(*http.Request) (string, error) { return "acme", nil }))
		sent := time.Now()
		first := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusCreated, first.status, "the effect happened: the client is told")
		assert.Less(t, time.Since(sent), lease, "the answer does not wait for the store")
		assert.Greater(t, store.Calls(faultstore.Complete), 1, "Complete was retried")
		assert.Zero(t, store.Calls(faultstore.Release), "the key is not released")
		got := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusConflict, got.status, "a retry finds the key in flight")
		assert.Equal(t, int64(1), h.executions.Load())
		// Complete goes on failing: once the lease has ended, a retry
		// takes the key over and runs again, as documented.
		waitFor(t, "the lease to end", func() bool {
			return post(t, srv.URL, "k", "x").status != http.StatusConflict
		})
		assert.Equal(t, int64(2), h.executions.Load())
		out := logs.String()
		assert.Contains(t, out, "level=ERROR")
		assert.Contains(t, out, "key=k")
		assert.Contains(t, out, "scope=acme")
		assert.Contains(t, out, "store timed out")
		assert.Contains(t, out, "never stored")
	})
	t.Run("until the store answers", func(t *testing.T) {
		// The store fails for longer than the store timeout, then
		// answers: the response, sent already, is stored, and a retry
		// gets it replayed instead of running again.
		store, _ := faulty(t)
		store.Set(faultstore.Complete, faultstore.Fault{Err: errFlaky, Times: 8})
		h := &orders{}
		srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{StoreTimeout: 50 * time.Millisecond, Lease: 10 * time.Second}))
		first := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusCreated, first.status)
		var again reply
		waitFor(t, "the response to be stored", func() bool {
			again = post(t, srv.URL, "k", "x")
			return again.status != http.StatusConflict
		})
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, int64(1), h.executions.Load())
		assert.Equal(t, 9, store.Calls(faultstore.Complete))
	})
}

// TestInFlightRetryAfter: a 409's Retry-After is a short hint, not the
// lease's remaining minute, and never longer than the lease has left.
func TestInFlightRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []server.Option
		want int
	}{
		{"default", nil, 1},
		{"configured", []server.Option{server.WithConfig(engine.Config{RetryAfter: 3 * time.Second})}, 3},
		{"capped by the lease", []server.Option{server.WithConfig(engine.Config{RetryAfter: time.Minute, Lease: 2 * time.Second})}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newBlocking()
			srv, _ := fixture(t, h, tc.opts...)
			first := postAsync(srv.URL, "k", "x")
			<-h.started
			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, http.StatusConflict, got.status)
			assert.Equal(t, strconv.Itoa(tc.want), got.header.Get("Retry-After"))
			close(h.release)
			<-first
		})
	}
}

// TestRetryStatusesReleasedWhateverTheirShape: a status that releases the key
// releases it even when the response was too large to store or was flushed.
func TestRetryStatusesReleasedWhateverTheirShape(t *testing.T) {
	big := strings.Repeat("e", 4096)
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
	}{
		{"large", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, big)
		}},
		{"flushed", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "slow down")
			http.NewResponseController(w).Flush()
		}},
		{"flushed before the status", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			http.NewResponseController(w).Flush()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					tc.write(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			srv, _ := fixture(t, h, server.WithMaxStored(1024))
			first := post(t, srv.URL, "k", "x")
			// Streamed, the answer may arrive before the key is released
			// (or the exchange stored).
			var second reply
			waitFor(t, "the key to be released or stored", func() bool {
				second = post(t, srv.URL, "k", "x")
				return second.status != http.StatusConflict
			})
			if first.status == http.StatusOK {
				// A flush before any status is a 200, which is stored.
				assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
				assert.Equal(t, int64(1), calls.Load())
				return
			}
			assert.Equal(t, http.StatusCreated, second.status, "the retry runs again")
			assert.Empty(t, second.header.Get("Idempotent-Replayed"))
			assert.Equal(t, int64(2), calls.Load())
		})
	}
}

// failingBody is a request body that breaks after a few bytes.
type failingBody struct{ n int }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errors.New("decoder broke")
	}
	n := min(len(p), b.n)
	for i := range n {
		p[i] = 'b'
	}
	b.n -= n
	return n, nil
}

func (*failingBody) Close() error { return nil }

// TestBodyReadFails: a body that cannot be read is answered 413 or 400, with
// nothing claimed and the handler not run.
func TestBodyReadFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outer  func(http.Handler) http.Handler
		want   int
		anchor string
	}{
		{"outer MaxBytesReader", func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = http.MaxBytesReader(w, r.Body, 4)
				next.ServeHTTP(w, r)
			})
		}, http.StatusRequestEntityTooLarge, "ErrBodyTooLarge"},
		{"broken decoder", func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = &failingBody{n: 3}
				next.ServeHTTP(w, r)
			})
		}, http.StatusBadRequest, "ErrBodyUnreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &orders{}
			mem, err := memstore.New()
			require.NoError(t, err)
			defer mem.Close()
			mw, err := server.New(mem)
			require.NoError(t, err)
			srv := startServer(t, tc.outer(mw.Handler(h)))
			got := post(t, srv.URL, "k", "a body of some length")
			assert.Equal(t, tc.want, got.status)
			assertProblem(t, got, tc.anchor)
			assert.Zero(t, h.executions.Load())
			assert.Zero(t, mem.Len(), "nothing claimed")
		})
	}
	t.Run("shorter than its Content-Length", func(t *testing.T) {
		h := &orders{}
		srv, mem := fixture(t, h)
		status, err := rawPostShort(srv.Listener.Addr().String(), "Idempotency-Key: k\r\n", 100, "only ten b")
		if err == nil {
			assert.Equal(t, http.StatusBadRequest, status)
		}
		waitFor(t, "the server to give up on the body", func() bool { return mem.Len() == 0 })
		assert.Zero(t, h.executions.Load())
	})
}

// TestEncodedPathsAreDifferentRequests: /items/a%2Fb and /items/a/b name
// different resources, so a key used for one is refused for the other.
func TestEncodedPathsAreDifferentRequests(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	assert.Equal(t, http.StatusCreated, post(t, srv.URL+"/items/a%2Fb", "k", "x").status)
	got := post(t, srv.URL+"/items/a/b", "k", "x")
	assert.Equal(t, http.StatusUnprocessableEntity, got.status)
	assert.Equal(t, int64(1), h.executions.Load())
}

// TestHandlerGivesUpWhenClientLeaves: a handler that returns without writing
// because its client went away is not stored as an empty 200; the retry runs.
func TestHandlerGivesUpWhenClientLeaves(t *testing.T) {
	var calls atomic.Int64
	started := make(chan struct{}, 1)
	gaveUp := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			started <- struct{}{}
			<-r.Context().Done()
			close(gaveUp)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	})
	srv, mem := fixture(t, h)
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
	<-started
	cancel()
	assert.Error(t, <-errc)
	<-gaveUp
	waitFor(t, "the claim to be released", func() bool { return mem.Len() == 0 })
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "made", got.body)
	assert.Empty(t, got.header.Get("Idempotent-Replayed"))
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

// rawPostShort sends a request whose body is shorter than the Content-Length
// it declares, then closes its side of the connection, and reads the answer
// if one comes.
func rawPostShort(addr, headers string, declared int, body string) (int, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s", declared, headers, body)
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestClientLeavesDuringClaim: the client goes away while a slow Claim is
// out. The Claim is seen through (its context ignores the disconnect), and
// the key it acquired is given back: nothing ran, and a retry runs at once
// instead of meeting a key in flight.
func TestClientLeavesDuringClaim(t *testing.T) {
	store, mem := faulty(t)
	store.Set(faultstore.Claim, faultstore.Fault{Delay: 200 * time.Millisecond, Times: 1})
	h := &orders{}
	srv := fixtureWith(t, store, h)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	_, err := http.DefaultClient.Do(req)
	require.Error(t, err, "the client gave up")
	waitFor(t, "the claim to be made and given back", func() bool {
		return store.Calls(faultstore.Release) == 1 && mem.Len() == 0
	})
	assert.Zero(t, h.executions.Load(), "nothing ran for a client that had gone")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, int64(1), h.executions.Load())
}
