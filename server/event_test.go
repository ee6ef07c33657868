package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
)

// events collects what an observer is told.
type events struct {
	mu  sync.Mutex
	all []engine.Event
}

func (e *events) observe(_ context.Context, ev engine.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// take returns the events so far and forgets them.
func (e *events) take() []engine.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.all
	e.all = nil
	return out
}

// last waits for the next final event (not a lease or acquired event) and
// returns it.
func (e *events) last(t *testing.T) engine.Event {
	t.Helper()
	var got engine.Event
	waitFor(t, "an event", func() bool {
		for _, ev := range e.take() {
			if ev.Kind != engine.EventLeaseRenewed && ev.Kind != engine.EventLeaseLost && ev.Kind != engine.EventAcquired {
				got = ev
				return true
			}
		}
		return false
	})
	return got
}

// TestEvents: each outcome of the protocol, through a real request, is told
// to the observer with its kind, key, scope, status and timings.
func TestEvents(t *testing.T) {
	var ev events
	store, _ := faulty(t)
	var fail bool
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		f := fail
		mu.Unlock()
		if f {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		time.Sleep(2 * time.Millisecond) // a handler that takes a measurable time
		w.WriteHeader(http.StatusCreated)
	})
	// A short lease: a response that could not be stored is tried again
	// for up to a lease length, and only then is the event told.
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Observer: ev.observe, Lease: time.Second}),
		server.WithScope(func(*http.Request) (string, error) { return "acme", nil }))

	check := func(kind engine.EventKind, key string, status int) engine.Event {
		t.Helper()
		e := ev.last(t)
		assert.Equal(t, kind, e.Kind, "kind %s, want %s", e.Kind, kind)
		assert.Equal(t, key, e.Key)
		assert.Equal(t, status, e.Status)
		assert.False(t, e.Start.IsZero(), "start")
		return e
	}
	post(t, srv.URL, "k1", "x")
	e := check(engine.EventExecuted, "k1", http.StatusCreated)
	assert.Equal(t, "acme", e.Scope)
	assert.Positive(t, e.ClaimTook)
	assert.GreaterOrEqual(t, e.HandlerTook, 2*time.Millisecond)
	assert.Positive(t, e.StoreTook)

	post(t, srv.URL, "k1", "x")
	e = check(engine.EventReplayed, "k1", http.StatusCreated)
	assert.Zero(t, e.HandlerTook)

	post(t, srv.URL, "k1", "other")
	check(engine.EventMismatch, "k1", http.StatusUnprocessableEntity)

	post(t, srv.URL, "", "x")
	e = check(engine.EventRejected, "", http.StatusBadRequest)
	assert.Empty(t, e.Scope)

	post(t, srv.URL, strings.Repeat("k", 300), "x")
	check(engine.EventRejected, "", http.StatusBadRequest)

	mu.Lock()
	fail = true
	mu.Unlock()
	post(t, srv.URL, "k2", "x")
	check(engine.EventReleased, "k2", http.StatusBadGateway)
	mu.Lock()
	fail = false
	mu.Unlock()

	down := errors.New("down")
	store.Set(faultstore.Claim, faultstore.Fault{Err: down})
	post(t, srv.URL, "k3", "x")
	e = check(engine.EventUnavailable, "k3", http.StatusServiceUnavailable)
	assert.ErrorIs(t, e.Err, down)
	store.Clear(faultstore.Claim)

	store.Set(faultstore.Complete, faultstore.Fault{Err: down})
	post(t, srv.URL, "k4", "x")
	e = check(engine.EventNotStored, "k4", http.StatusCreated)
	assert.ErrorIs(t, e.Err, down)
	store.Clear(faultstore.Complete)

	post(t, srv.URL, "k4", "x")
	check(engine.EventInFlight, "k4", http.StatusConflict)
}

// TestLeaseEvents: a renewal yields EventLeaseRenewed, and a lease that ends
// unrenewed yields EventLeaseLost. The lease is long enough for a loaded
// machine (with -race) to answer the Claim and the first Extend within it:
// with 60 ms, a Claim answered after 54 ms was refused, and the handler never
// started.
func TestLeaseEvents(t *testing.T) {
	var ev events
	store, _ := faulty(t)
	release := make(chan struct{})
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Observer: ev.observe, Lease: time.Second}))
	got := postAsync(srv.URL, "k", "x")
	select {
	case <-started:
	case r := <-got:
		require.FailNow(t, "answered before the handler started", "%d %s", r.status, r.body)
	}
	var renewed bool
	waitFor(t, "a renewal", func() bool {
		for _, e := range ev.take() {
			renewed = renewed || (e.Kind == engine.EventLeaseRenewed && e.Key == "k")
		}
		return renewed
	})
	store.Set(faultstore.Extend, faultstore.Fault{Err: errFlaky})
	var lost engine.Event
	waitFor(t, "the lease to be lost", func() bool {
		for _, e := range ev.take() {
			if e.Kind == engine.EventLeaseLost {
				lost = e
				return true
			}
		}
		return false
	})
	assert.ErrorIs(t, lost.Err, engine.ErrLeaseLost)
	close(release)
	require.Equal(t, http.StatusServiceUnavailable, recv(t, got, "the answer").status)
}

// TestAcquiredEvents: a request that acquires its key yields EventAcquired
// and then its final event with Acquired set, whatever the outcome; one that
// does not acquire it yields only its final event, with Acquired unset. So
// an observer can count the claims in flight.
func TestAcquiredEvents(t *testing.T) {
	var ev events
	store, _ := faulty(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if string(body) == "fail" {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	// Complete is retried within the store timeout, then, once the
	// response is sent, for up to a lease length before it gives up: a
	// short lease.
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Observer: ev.observe, StoreTimeout: 200 * time.Millisecond, Lease: time.Second}))
	down := errors.New("down")

	tests := []struct {
		name      string
		key, body string
		fail      []faultstore.Op
		want      []engine.EventKind
		acquired  bool
	}{
		{"executed", "k1", "x", nil, []engine.EventKind{engine.EventAcquired, engine.EventExecuted}, true},
		{"replayed", "k1", "x", nil, []engine.EventKind{engine.EventReplayed}, false},
		{"mismatch", "k1", "y", nil, []engine.EventKind{engine.EventMismatch}, false},
		{"released", "k2", "fail", nil, []engine.EventKind{engine.EventAcquired, engine.EventReleased}, true},
		{"rejected", "", "x", nil, []engine.EventKind{engine.EventRejected}, false},
		{"claim failed", "k3", "x", []faultstore.Op{faultstore.Claim}, []engine.EventKind{engine.EventUnavailable}, false},
		{"not stored", "k4", "x", []faultstore.Op{faultstore.Complete}, []engine.EventKind{engine.EventAcquired, engine.EventNotStored}, true},
		{"in flight", "k4", "x", nil, []engine.EventKind{engine.EventInFlight}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, op := range tt.fail {
				store.Set(op, faultstore.Fault{Err: down})
				defer store.Clear(op)
			}
			post(t, srv.URL, tt.key, tt.body)
			var got []engine.Event
			waitFor(t, "the final event", func() bool {
				for _, e := range ev.take() {
					if e.Kind != engine.EventLeaseRenewed {
						got = append(got, e)
					}
				}
				return len(got) > 0 && got[len(got)-1].Kind != engine.EventAcquired
			})
			kinds := make([]engine.EventKind, len(got))
			for i, e := range got {
				kinds[i] = e.Kind
			}
			require.Equal(t, tt.want, kinds)
			final := got[len(got)-1]
			assert.Equal(t, tt.acquired, final.Acquired, "final event's Acquired")
			if tt.acquired {
				first := got[0]
				assert.False(t, first.Acquired, "EventAcquired's own Acquired")
				assert.Equal(t, tt.key, first.Key)
				assert.Positive(t, first.ClaimTook)
				assert.Equal(t, first.Start, final.Start)
				assert.Equal(t, first.ClaimTook, final.ClaimTook)
			}
		})
	}
}
