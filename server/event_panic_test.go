package server_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// panicky is an observer that panics on the kinds it is given, and tells
// of each event it saw before it panicked.
type panicky struct {
	kinds map[engine.EventKind]bool
	seen  chan engine.EventKind
}

func newPanicky(kinds ...engine.EventKind) *panicky {
	p := &panicky{kinds: map[engine.EventKind]bool{}, seen: make(chan engine.EventKind, 64)}
	for _, k := range kinds {
		p.kinds[k] = true
	}
	return p
}

func (p *panicky) observe(_ context.Context, e engine.Event) {
	select {
	case p.seen <- e.Kind:
	default:
	}
	if p.kinds[e.Kind] {
		panic("observer bug on " + e.Kind.String())
	}
}

// panicLogs counts the log records that report an observer's panic.
func panicLogs(logs *syncBuffer) int {
	return strings.Count(logs.String(), "idempotency observer panicked")
}

// TestObserverPanicOnAcquired: a panic on EventAcquired, which comes
// between the claim and the handler, neither leaves the key claimed nor
// stops the request: it runs, is stored, and is replayed; the panic is
// logged once, with the event's kind.
func TestObserverPanicOnAcquired(t *testing.T) {
	var logs syncBuffer
	p := newPanicky(engine.EventAcquired)
	h := &orders{}
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Observer: p.observe, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))

	first := post(t, srv.URL, "k1", "x")
	require.Equal(t, http.StatusCreated, first.status)
	again := post(t, srv.URL, "k1", "x")
	assert.Equal(t, http.StatusCreated, again.status)
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.body, again.body)
	assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k2", "x").status)
	assert.Equal(t, int64(2), h.executions.Load())

	assert.Equal(t, 1, panicLogs(&logs), "logged once per Middleware: %s", logs.String())
	assert.Contains(t, logs.String(), "event=acquired")
	assert.Contains(t, logs.String(), "observer bug on acquired")
}

// TestObserverPanicOnLeaseEvent: a lease event is told on a timer's
// goroutine, where an unrecovered panic ends the process; it is recovered
// and the lease goes on being renewed.
func TestObserverPanicOnLeaseEvent(t *testing.T) {
	var logs syncBuffer
	p := newPanicky(engine.EventLeaseRenewed)
	renewals := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Run until the lease has been renewed, and its event has
		// panicked, twice.
		for range 2 {
			select {
			case <-renewals:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Observer: p.observe, Lease: 30 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	got := postAsync(srv.URL, "k", "x")
	for n := 0; n < 2; {
		if recv(t, p.seen, "an event") == engine.EventLeaseRenewed {
			renewals <- struct{}{}
			n++
		}
	}
	assert.Equal(t, http.StatusCreated, recv(t, got, "the answer").status)
	assert.Equal(t, "true", post(t, srv.URL, "k", "x").header.Get("Idempotent-Replayed"))
	assert.Equal(t, 1, panicLogs(&logs), "logged once per Middleware: %s", logs.String())
	assert.Contains(t, logs.String(), "event=lease_renewed")
}

// TestObserverPanicOnFinalEvents: an observer that panics on every event
// changes no answer, and is logged once.
func TestObserverPanicOnFinalEvents(t *testing.T) {
	var logs syncBuffer
	all := []engine.EventKind{engine.EventExecuted, engine.EventReplayed, engine.EventInFlight, engine.EventMismatch,
		engine.EventRejected, engine.EventUnavailable, engine.EventReleased, engine.EventNotStored,
		engine.EventUnprotected, engine.EventClientGone, engine.EventLeaseRenewed, engine.EventLeaseLost, engine.EventAcquired}
	p := newPanicky(all...)
	h := &orders{}
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Observer: p.observe, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	for _, tc := range []struct {
		name, key, body string
		status          int
		replayed        string
	}{
		{"executed", "k", "x", http.StatusCreated, ""},
		{"replayed", "k", "x", http.StatusCreated, "true"},
		{"mismatch", "k", "y", http.StatusUnprocessableEntity, ""},
		{"rejected", "", "x", http.StatusBadRequest, ""},
		{"executed again", "k2", "x", http.StatusCreated, ""},
	} {
		got := post(t, srv.URL, tc.key, tc.body)
		assert.Equal(t, tc.status, got.status, tc.name)
		assert.Equal(t, tc.replayed, got.header.Get("Idempotent-Replayed"), tc.name)
	}
	assert.Equal(t, int64(2), h.executions.Load())
	assert.Equal(t, 1, panicLogs(&logs), "logged once per Middleware: %s", logs.String())
	assert.Contains(t, logs.String(), "event=acquired", "the first panic was on the first event told")
}
