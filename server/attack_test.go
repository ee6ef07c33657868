package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/wire"
	"github.com/idemkit/idempotency/server"
)

// TestPreClaimCallbackPanics: the scope, fingerprint and key-format
// functions run before anything is claimed, so a panic in one is left to
// net/http and leaves nothing behind: the retry runs, once.
func TestPreClaimCallbackPanics(t *testing.T) {
	tests := []struct {
		name string
		opt  func(panicOnce func()) server.Option
	}{
		{"WithScope", func(p func()) server.Option {
			return server.WithScope(func(*http.Request) (string, error) { p(); return "s", nil })
		}},
		{"WithFingerprint", func(p func()) server.Option {
			return server.WithFingerprint(func(r *http.Request, b []byte) (string, error) { p(); return server.Fingerprint(r, b) })
		}},
		{"WithKeyFormat", func(p func()) server.Option {
			return server.WithKeyFormat(func(string) error { p(); return nil })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var panicked atomic.Bool
			p := func() {
				if !panicked.Swap(true) {
					panic("callback bug")
				}
			}
			h := &orders{}
			srv, _ := fixture(t, h, tt.opt(p), server.WithConfig(engine.Config{Logger: discardLogger()}))
			first := recv(t, postAsync(srv.URL, "k", "x"), "the first answer")
			assert.Equal(t, -1, first.status, "net/http ends the exchange: %s", first.body)
			assert.Zero(t, h.executions.Load())
			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, http.StatusCreated, got.status, "nothing was left claimed: %s", got.body)
			assert.Empty(t, got.header.Get("Idempotent-Replayed"))
			assert.Equal(t, int64(1), h.executions.Load())
		})
	}
}

// TestRefuseAbandonedWithWait: a waiter (WithWait) whose own Claim takes
// over an abandoned key gets the final "outcome unknown" answer under
// RefuseAbandoned, without running the handler; under RerunAbandoned it runs
// and sees the takeover.
func TestRefuseAbandonedWithWait(t *testing.T) {
	for _, tc := range []struct {
		policy engine.AbandonedPolicy
		status int
		runs   int64
	}{
		{engine.RefuseAbandoned, http.StatusConflict, 0},
		{engine.RerunAbandoned, http.StatusCreated, 1},
	} {
		t.Run(fmt.Sprint(tc.policy), func(t *testing.T) {
			mem := newMem(t)
			var seen atomic.Int64
			o := &orders{}
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				l, _ := engine.LeaseFromContext(r.Context())
				seen.Store(int64(l.Abandoned))
				o.ServeHTTP(w, r)
			})
			srv := fixtureWith(t, mem, h, server.WithConfig(engine.Config{Abandoned: tc.policy, Wait: 10 * time.Second, Logger: discardLogger()}))
			// A holder that dies: it claims the key for the request's
			// fingerprint, and never completes it.
			req, err := http.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
			require.NoError(t, err)
			fp, err := server.Fingerprint(req, []byte("x"))
			require.NoError(t, err)
			c, err := mem.Claim(context.Background(), engine.ID{Key: "k"}, fp, 300*time.Millisecond, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)

			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, tc.status, got.status, got.body)
			assert.Equal(t, tc.runs, o.executions.Load())
			if tc.policy == engine.RefuseAbandoned {
				var p struct{ Code string }
				require.NoError(t, json.Unmarshal([]byte(got.body), &p))
				assert.Equal(t, wire.CodeOutcomeUnknown, p.Code)
				again := post(t, srv.URL, "k", "x")
				assert.Equal(t, http.StatusConflict, again.status)
				assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			} else {
				assert.Equal(t, int64(1), seen.Load(), "the handler sees the abandoned holder")
			}
			assert.Equal(t, tc.runs, o.executions.Load(), "never run again")
		})
	}
}

// TestDoubledKeyHeaderAnyCase: the key header sent twice, in two cases of
// letters, is one header with two values: refused, nothing claimed.
func TestDoubledKeyHeaderAnyCase(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Logger: discardLogger()}))
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nidempotency-key: a\r\nIDEMPOTENCY-KEY: b\r\nContent-Length: 1\r\n\r\nx")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Zero(t, h.executions.Load())
}

// brokenClaim is a Store whose Claim breaks its contract: Completed without
// a Response.
type brokenClaim struct{ engine.Store }

func (brokenClaim) Claim(_ context.Context, _ engine.ID, fp string, _, _ time.Duration) (engine.Claim, error) {
	return engine.Claim{Status: engine.Completed, Fingerprint: fp}, nil
}

// TestCompletedWithoutResponse: a Store that reports a completed record
// without its response fails closed, with 503, rather than panicking on
// every retry of the key.
func TestCompletedWithoutResponse(t *testing.T) {
	h := &orders{}
	srv := fixtureWith(t, brokenClaim{newMem(t)}, h, server.WithConfig(engine.Config{Logger: discardLogger()}))
	got := recv(t, postAsync(srv.URL, "k", "x"), "the answer")
	assert.Equal(t, http.StatusServiceUnavailable, got.status, got.body)
	assert.Zero(t, h.executions.Load())
}

// TestInvalidStatusNotStored: a handler that writes a status net/http
// refuses (below 100 or above 999) panics in net/http without the
// middleware; behind it, it must not be recorded as done with a status that
// no replay can send, which would make every retry of the key fail for the
// TTL, nor as a 200 it never sent.
func TestInvalidStatusNotStored(t *testing.T) {
	for _, code := range []int{0, 42, 1000} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			var calls atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					w.WriteHeader(code)
				}
				w.WriteHeader(http.StatusCreated)
			})
			srv := fixtureWith(t, newMem(t), h, server.WithKeep(func(int) bool { return true }),
				server.WithConfig(engine.Config{Logger: discardLogger()}))
			first := recv(t, postAsync(srv.URL, "k", "x"), "the first answer")
			assert.Equal(t, -1, first.status, "as without the middleware, net/http ends the exchange: %d %s", first.status, first.body)
			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, http.StatusCreated, got.status, "the retry runs: %s", got.body)
			assert.Empty(t, got.header.Get("Idempotent-Replayed"))
			assert.Equal(t, int64(2), calls.Load())
		})
	}
}

// TestMethodLetterCase: a client may send a protected method in lower case
// ("post", with a key the caller set: net/http's client sends the method as
// given, and a handler that does not route by method runs it). The middleware must protect it too: unprotected, each
// retry would run the handler again.
func TestMethodLetterCase(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Logger: discardLogger()}))
	var got []reply
	for range 2 {
		req, err := http.NewRequest("post", srv.URL, strings.NewReader("x"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		got = append(got, reply{resp.StatusCode, resp.Header, string(b)})
	}
	assert.Equal(t, int64(1), h.executions.Load(), "the retry did not run again")
	assert.Equal(t, "true", got[1].header.Get("Idempotent-Replayed"))
	assert.Equal(t, got[0].body, got[1].body)
}

// pastLease is a Store whose Claim reports the key in flight with a lease
// that ended a second ago, for the request's own fingerprint: a store whose
// clock is behind, or a broken one.
type pastLease struct{ claims atomic.Int64 }

func (s *pastLease) Claim(_ context.Context, _ engine.ID, fp string, _, _ time.Duration) (engine.Claim, error) {
	s.claims.Add(1)
	return engine.Claim{Status: engine.InFlight, Fingerprint: fp, RetryAfter: -time.Second}, nil
}

func (*pastLease) Complete(context.Context, engine.ID, engine.Token, *engine.Response, time.Duration) error {
	return nil
}
func (*pastLease) Release(context.Context, engine.ID, engine.Token) error               { return nil }
func (*pastLease) Extend(context.Context, engine.ID, engine.Token, time.Duration) error { return nil }

// TestWaitWithNegativeRetryAfter: a waiter (WithWait) told that the lease
// in flight has negative time left still waits between its Claims, at least
// a millisecond, rather than asking the store as fast as it answers for the
// whole wait.
func TestWaitWithNegativeRetryAfter(t *testing.T) {
	store := &pastLease{}
	const wait = 200 * time.Millisecond
	srv := fixtureWith(t, store, &orders{}, server.WithConfig(engine.Config{Wait: wait, Logger: discardLogger()}))
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusConflict, got.status)
	// One Claim, then at most one per millisecond of the wait.
	assert.LessOrEqual(t, store.claims.Load(), int64(wait/time.Millisecond)+2, "Claims during the wait")
}

// TestTimeoutHandlerOutside: http.TimeoutHandler around the middleware
// answers 503 at its deadline while the handler goes on, but the key stays
// held: the retries get 409 until the handler's response is stored, then its
// replay, and the handler runs once. (Inside the middleware, its 503 would
// be the handler's answer, the key released while the handler still runs,
// and a retry would run it again: the package doc says so.)
func TestTimeoutHandlerOutside(t *testing.T) {
	finish := make(chan struct{})
	o := &orders{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-finish // a handler that does not watch its context
		o.ServeHTTP(w, r)
	})
	mw, err := server.New(newMem(t), server.WithConfig(engine.Config{Logger: discardLogger()}))
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, mw) })
	srv := startServer(t, http.TimeoutHandler(mw.Handler(h), 500*time.Millisecond, "timed out"))

	assert.Equal(t, http.StatusServiceUnavailable, post(t, srv.URL, "k", "x").status, "the TimeoutHandler's answer")
	assert.Equal(t, http.StatusConflict, post(t, srv.URL, "k", "x").status, "the key is still held")
	close(finish)
	var got reply
	waitFor(t, "the response to be stored", func() bool {
		got = post(t, srv.URL, "k", "x")
		return got.status != http.StatusConflict
	})
	assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"), "%d %s", got.status, got.body)
	assert.Equal(t, int64(1), o.executions.Load())
}

// TestRefuseAbandonedWhileFirstRuns: under RefuseAbandoned, a retry takes
// the key over from a holder whose lease ended unrenewed while its handler,
// which ignores its context, still runs. The retry gets the final "outcome
// unknown" answer and runs nothing; the first holder's late Complete is
// refused by fencing, so the record stays the refusal, and the handler ran
// once.
func TestRefuseAbandonedWhileFirstRuns(t *testing.T) {
	store, _ := faulty(t)
	store.Set(faultstore.Extend, faultstore.Fault{Err: errFlaky})
	finish := make(chan struct{})
	var cancelled atomic.Bool
	o := &orders{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		cancelled.Store(true)
		<-finish // and goes on regardless
		o.ServeHTTP(w, r)
	})
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: time.Second, Abandoned: engine.RefuseAbandoned, Logger: discardLogger()}))
	first := postAsync(srv.URL, "k", "x")
	waitFor(t, "the first handler to be cancelled", cancelled.Load)
	var got reply
	waitFor(t, "the lease to end in the store", func() bool {
		got = post(t, srv.URL, "k", "x")
		return got.status != http.StatusConflict || got.header.Get(engine.HeaderOutcome) != ""
	})
	assert.Equal(t, http.StatusConflict, got.status, got.body)
	assert.Equal(t, "unknown", got.header.Get(engine.HeaderOutcome))
	close(finish)
	assert.Equal(t, http.StatusCreated, recv(t, first, "the first answer").status, "the first client is told what happened")
	again := post(t, srv.URL, "k", "x")
	assert.Equal(t, "unknown", again.header.Get(engine.HeaderOutcome), "the record is still the refusal")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), o.executions.Load())
}

// TestFlushThroughWriterThatCannot: behind a ResponseWriter wrapper that
// cannot flush (a logging writer without Flush or Unwrap), a handler's
// Flush sends nothing early, so the response is kept whole: its replay has
// the body, rather than being marked as omitted.
func TestFlushThroughWriterThatCannot(t *testing.T) {
	mw, err := server.New(newMem(t), server.WithConfig(engine.Config{Logger: discardLogger()}))
	require.NoError(t, err)
	t.Cleanup(func() { shutdown(t, mw) })
	var flushErr atomic.Value
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "small")
		if err := http.NewResponseController(w).Flush(); err != nil {
			flushErr.Store(err)
		}
	})
	inner := mw.Handler(h)
	srv := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(struct{ http.ResponseWriter }{w}, r)
	}))
	first := post(t, srv.URL, "k", "x")
	again := post(t, srv.URL, "k", "x")
	assert.Equal(t, "small", first.body)
	err, _ = flushErr.Load().(error)
	assert.ErrorIs(t, err, http.ErrNotSupported, "the handler learns that it cannot flush")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Empty(t, again.header.Get(server.HeaderBodyOmitted))
	assert.Equal(t, "small", again.body)
}
