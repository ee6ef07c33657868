package idemotel_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

var (
	outcome = attribute.Key("idempotency.outcome").String
	op      = attribute.Key("idempotency.store.operation").String
)

func status(code int) attribute.KeyValue  { return attribute.Int("http.response.status_code", code) }
func errType(v string) attribute.KeyValue { return attribute.String("error.type", v) }

// api is a middleware observed by idemotel in front of a handler that
// answers by the request's body: "fail" 502, "block" when unblocked,
// anything else 201.
type api struct {
	url     string
	store   *faultstore.Store
	events  chan engine.Event // the final events
	entered chan struct{}     // a "block" request is in the handler
	unblock chan struct{}
	tracer  trace.Tracer
	front   chan trace.SpanContext // the span in front of the middleware, per request
}

// newAPI serves the test API through the middleware, with an observer that
// feeds tm and the request's events, and lease as its lease.
func newAPI(t *testing.T, tm *telemetry, otelOpts []idemotel.Option, lease time.Duration, opts ...server.Option) *api {
	t.Helper()
	mem, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	a := &api{
		store:   faultstore.New(mem),
		events:  make(chan engine.Event, 100),
		entered: make(chan struct{}, 10),
		unblock: make(chan struct{}),
		tracer:  tm.tp.Tracer("front"),
		front:   make(chan trace.SpanContext, 100),
	}
	observe, err := idemotel.ServerObserver(tm.options(otelOpts...)...)
	require.NoError(t, err)
	mw, err := server.New(a.store, append([]server.Option{
		server.WithConfig(engine.Config{Observer: func(ctx context.Context, e engine.Event) {
			observe(ctx, e)
			switch e.Kind {
			case engine.EventAcquired, engine.EventLeaseRenewed, engine.EventLeaseLost:
			default:
				a.events <- e
			}
		}, StoreTimeout: 300 * time.Millisecond, Lease: lease}),
	}, opts...)...)
	require.NoError(t, err)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch string(body) {
		case "fail":
			w.WriteHeader(http.StatusBadGateway)
			return
		case "block":
			a.entered <- struct{}{}
			select {
			case <-a.unblock:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
	})
	// What otelhttp does: a span for the request, in its context.
	front := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, span := a.tracer.Start(r.Context(), "POST /orders")
			defer span.End()
			a.front <- span.SpanContext()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	srv := httptest.NewServer(front(mw.Handler(h)))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// post sends a request with key (none if empty) and body, and returns its
// status, or 0 if there is no response.
func (a *api) post(ctx context.Context, key, body string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, strings.NewReader(body))
	if err != nil {
		return -1
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// final waits for the final event of the next request.
func (a *api) final(t *testing.T) engine.Event {
	t.Helper()
	select {
	case e := <-a.events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return engine.Event{}
	}
}

// TestServerOutcomes: each outcome of the protocol, through a real loopback
// request, is counted under its name with its status, and recorded as a
// span with the steps it took as children, under the request's span.
func TestServerOutcomes(t *testing.T) {
	tm := newTelemetry(t)
	a := newAPI(t, tm, nil, time.Second, server.WithKeyOptional())
	down := errors.New("down")
	ctx := t.Context()

	type check struct {
		kind     engine.EventKind
		status   int
		children []string
	}
	var checks []check
	expect := func(kind engine.EventKind, status int, children ...string) {
		t.Helper()
		e := a.final(t)
		require.Equal(t, kind, e.Kind, "event %s, want %s", e.Kind, kind)
		checks = append(checks, check{kind, status, children})
	}

	require.Equal(t, 201, a.post(ctx, "k1", "x"))
	expect(engine.EventExecuted, 201, "idempotency.claim", "idempotency.handler", "idempotency.complete")
	require.Equal(t, 201, a.post(ctx, "k1", "x"))
	expect(engine.EventReplayed, 201, "idempotency.claim")
	require.Equal(t, 422, a.post(ctx, "k1", "y"))
	expect(engine.EventMismatch, 422, "idempotency.claim")
	require.Equal(t, 400, a.post(ctx, strings.Repeat("k", 300), "x"))
	expect(engine.EventRejected, 400)
	require.Equal(t, 201, a.post(ctx, "", "x"))
	expect(engine.EventUnprotected, 0)
	require.Equal(t, 502, a.post(ctx, "k2", "fail"))
	expect(engine.EventReleased, 502, "idempotency.claim", "idempotency.handler", "idempotency.release")

	a.store.Set(faultstore.Claim, faultstore.Fault{Err: down})
	require.Equal(t, 503, a.post(ctx, "k3", "x"))
	expect(engine.EventUnavailable, 503, "idempotency.claim")
	a.store.Clear(faultstore.Claim)

	a.store.Set(faultstore.Complete, faultstore.Fault{Err: down})
	require.Equal(t, 201, a.post(ctx, "k4", "x"))
	expect(engine.EventNotStored, 201, "idempotency.claim", "idempotency.handler", "idempotency.complete")
	a.store.Clear(faultstore.Complete)

	// A request in flight: its claim is counted while its handler runs,
	// and a second request with its key gets 409.
	blocked := make(chan int, 1)
	go func() { blocked <- a.post(ctx, "k5", "block") }()
	<-a.entered
	assert.Equal(t, int64(1), sum(t, tm.collect(t)["idempotency.server.active_claims"]), "claims in flight while a handler runs")
	require.Equal(t, 409, a.post(ctx, "k5", "block"))
	expect(engine.EventInFlight, 409, "idempotency.claim")
	close(a.unblock)
	require.Equal(t, 201, <-blocked)
	expect(engine.EventExecuted, 201, "idempotency.claim", "idempotency.handler", "idempotency.complete")

	// The client leaves while the claim is made: nothing runs.
	a.store.Set(faultstore.Claim, faultstore.Fault{Delay: 200 * time.Millisecond})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	a.post(short, "k6", "x")
	cancel()
	expect(engine.EventClientGone, 0, "idempotency.claim", "idempotency.release")
	a.store.Clear(faultstore.Claim)

	m := tm.collect(t)
	requests := m["idempotency.server.requests"]
	assert.Equal(t, "{request}", requests.Unit)
	total := map[engine.EventKind]int64{}
	for _, c := range checks {
		total[c.kind]++
	}
	for kind, n := range total {
		assert.Equal(t, n, sum(t, requests, outcome(kind.String())), "requests with outcome %s", kind)
	}
	assert.Equal(t, int64(2), sum(t, requests, outcome("executed"), status(201)))
	assert.Equal(t, int64(1), sum(t, requests, status(502), errType("502")), "a 5xx has its error.type")
	assert.Equal(t, int64(1), sum(t, requests, status(503), errType("503")))
	assert.Zero(t, sum(t, requests, status(422), errType("422")), "a 4xx is no server error")
	assert.Zero(t, sum(t, m["idempotency.server.active_claims"]), "claims in flight at the end")

	store := m["idempotency.server.store.duration"]
	assert.Equal(t, "s", store.Unit)
	// Every request but the rejected one and the one without a key made a
	// Claim; one failed.
	assert.Equal(t, uint64(len(checks)-2), count(t, store, op("claim")))
	assert.Equal(t, uint64(1), count(t, store, op("claim"), errType("_OTHER")))
	assert.Equal(t, uint64(3), count(t, store, op("complete")))
	assert.Equal(t, uint64(1), count(t, store, op("complete"), errType("_OTHER")))
	assert.Equal(t, uint64(2), count(t, store, op("release")), "the 502 and the client gone")
	handler := m["idempotency.server.handler.duration"]
	assert.Equal(t, uint64(4), count(t, handler), "handlers run: two executed, the 502, the one not stored")

	// The spans, one per request, each under the request's own span.
	fronts := map[trace.SpanID]bool{}
	for range len(a.front) {
		fronts[(<-a.front).SpanID()] = true
	}
	seen := map[engine.EventKind]int{}
	for _, c := range checks {
		spans := tm.spansNamed("idempotency.request", outcome(c.kind.String()))
		require.Greater(t, len(spans), seen[c.kind], "a span for %s", c.kind)
		s := spans[seen[c.kind]]
		seen[c.kind]++
		assert.True(t, fronts[s.Parent().SpanID()], "%s: the span's parent is the request's", c.kind)
		assert.Equal(t, c.children, tm.children(s), "%s: children", c.kind)
		attrs := attribute.NewSet(s.Attributes()...)
		if c.status != 0 {
			assert.True(t, matches(attrs, []attribute.KeyValue{status(c.status)}), "%s: status %v", c.kind, s.Attributes())
		}
		_, hasKey := attrs.Value(attribute.Key("idempotency.key"))
		assert.False(t, hasKey, "%s: the key is never on a span", c.kind)
		for _, child := range tm.spans.Ended() {
			if child.Parent().SpanID() == s.SpanContext().SpanID() {
				assert.False(t, child.StartTime().Before(s.StartTime()), "%s: %s starts before its parent", c.kind, child.Name())
				assert.False(t, child.EndTime().After(s.EndTime()), "%s: %s ends after its parent", c.kind, child.Name())
			}
		}
		switch c.kind {
		case engine.EventUnavailable, engine.EventNotStored:
			assert.Equal(t, codes.Error, s.Status().Code, "%s: span status", c.kind)
		case engine.EventExecuted, engine.EventReplayed:
			assert.Equal(t, codes.Unset, s.Status().Code, "%s: span status", c.kind)
		}
	}
}

// TestServerAttributes: WithAttributes goes on the spans and the metrics;
// the key goes on neither.
func TestServerAttributes(t *testing.T) {
	tm := newTelemetry(t)
	a := newAPI(t, tm, []idemotel.Option{idemotel.WithAttributes(attribute.String("api", "orders"))}, time.Second)
	require.Equal(t, 201, a.post(t.Context(), "order-42", "x"))
	a.final(t)
	spans := tm.spansNamed("idempotency.request", attribute.String("api", "orders"))
	require.Len(t, spans, 1)
	set := attribute.NewSet(spans[0].Attributes()...)
	_, hasKey := set.Value(attribute.Key("idempotency.key"))
	assert.False(t, hasKey, "the key is never on a span")
	for name, m := range tm.collect(t) {
		for _, set := range attributeSets(t, m) {
			for _, kv := range set.ToSlice() {
				assert.NotEqual(t, "order-42", kv.Value.String(), "%s carries the key as %s", name, kv.Key)
			}
		}
	}
	assert.Equal(t, int64(1), sum(t, tm.collect(t)["idempotency.server.requests"], attribute.String("api", "orders")))
}

// TestServerLeaseEvents: renewals and a loss are counted, and added as
// events to the request's span.
func TestServerLeaseEvents(t *testing.T) {
	tm := newTelemetry(t)
	a := newAPI(t, tm, nil, 90*time.Millisecond)
	got := make(chan int, 1)
	go func() { got <- a.post(t.Context(), "k", "block") }()
	<-a.entered
	waitFor(t, "a renewal", func() bool {
		return sum(t, tm.collect(t)["idempotency.server.lease.renewals"]) > 0
	})
	a.store.Set(faultstore.Extend, faultstore.Fault{Err: errors.New("down")})
	require.Equal(t, http.StatusServiceUnavailable, <-got)
	e := a.final(t)
	require.Equal(t, engine.EventUnavailable, e.Kind)
	waitFor(t, "the request's span", func() bool { return len(tm.spansNamed("POST /orders")) == 1 })

	m := tm.collect(t)
	assert.Equal(t, int64(1), sum(t, m["idempotency.server.lease.losses"]))
	assert.Positive(t, count(t, m["idempotency.server.store.duration"], op("extend")))
	fronts := tm.spansNamed("POST /orders")
	require.Len(t, fronts, 1)
	var names []string
	for _, ev := range fronts[0].Events() {
		names = append(names, ev.Name)
	}
	assert.Contains(t, names, "idempotency.lease.renewed")
	assert.Contains(t, names, "idempotency.lease.lost")
	requests := tm.spansNamed("idempotency.request", outcome("unavailable"))
	require.Len(t, requests, 1)
	assert.Equal(t, []string{"idempotency.claim", "idempotency.handler", "idempotency.release"}, tm.children(requests[0]))
	assert.Zero(t, sum(t, m["idempotency.server.active_claims"]))
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(time.Millisecond)
	}
}
