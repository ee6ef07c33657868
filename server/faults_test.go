package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
)

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
