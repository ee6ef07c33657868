package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/incoming"
)

// TestNewRefuses: New names every invalid field of the configuration, one
// message each, and refuses a nil store.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		want []string
	}{
		{"TTL too short", engine.Config{TTL: 5 * time.Millisecond},
			[]string{"engine: TTL 5ms is shorter than 10ms"}},
		{"TTL negative", engine.Config{TTL: -time.Second},
			[]string{"engine: TTL -1s is shorter than 10ms"}},
		{"lease too short", engine.Config{Lease: time.Millisecond},
			[]string{"engine: lease 1ms is shorter than 10ms"}},
		{"lease negative", engine.Config{Lease: -time.Minute},
			[]string{"engine: lease -1m0s is shorter than 10ms"}},
		{"lease longer than the TTL", engine.Config{TTL: time.Minute, Lease: time.Hour},
			[]string{"engine: lease 1h0m0s is longer than TTL 1m0s"}},
		{"lease longer than the default TTL", engine.Config{Lease: 25 * time.Hour},
			[]string{"engine: lease 25h0m0s is longer than TTL 24h0m0s"}},
		{"store timeout negative", engine.Config{StoreTimeout: -time.Second},
			[]string{"engine: store timeout -1s is negative"}},
		{"wait negative", engine.Config{Wait: -time.Millisecond},
			[]string{"engine: wait -1ms is negative"}},
		{"Retry-After negative", engine.Config{RetryAfter: -time.Second},
			[]string{"engine: Retry-After -1s is negative"}},
		{"unknown abandoned policy", engine.Config{Abandoned: engine.RefuseAbandoned + 1},
			[]string{"engine: unknown abandoned policy 2"}},
		{"every field at once",
			engine.Config{TTL: time.Millisecond, Lease: time.Millisecond, StoreTimeout: -1, Wait: -1, RetryAfter: -1, Abandoned: -1},
			[]string{
				"engine: TTL 1ms is shorter than 10ms",
				"engine: lease 1ms is shorter than 10ms",
				"engine: store timeout -1ns is negative",
				"engine: wait -1ns is negative",
				"engine: Retry-After -1ns is negative",
				"engine: unknown abandoned policy -1",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := engine.New(&fakeStore{}, tc.cfg)
			if err == nil {
				e.Shutdown(context.Background())
				t.Fatalf("New(%+v) = nil error, want %q", tc.cfg, tc.want)
			}
			if e != nil {
				t.Error("New returned an engine with its error")
			}
			if got := strings.Split(err.Error(), "\n"); !equal(got, tc.want) {
				t.Errorf("New(%+v) = %q, want %q", tc.cfg, got, tc.want)
			}
		})
	}
	t.Run("nil store", func(t *testing.T) {
		if _, err := engine.New(nil, engine.Config{}); err == nil || !strings.HasPrefix(err.Error(), "engine: ") {
			t.Errorf("New(nil) = %v, want an engine error", err)
		}
	})
	t.Run("nil pointer in the interface", func(t *testing.T) {
		var s *fakeStore
		if _, err := engine.New(s, engine.Config{}); err == nil {
			t.Error("New((*fakeStore)(nil)) = nil error, want one")
		}
	})
	t.Run("nil func as a store", func(t *testing.T) {
		var s funcStore
		if _, err := engine.New(s, engine.Config{}); err == nil {
			t.Error("New(funcStore(nil)) = nil error, want one")
		}
	})
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// funcStore is a Store of another kind than a pointer, to show that New
// tells a nil one from a valid one whatever its kind.
type funcStore func() *fakeStore

func (f funcStore) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	return f().Claim(ctx, id, fp, lease, ttl)
}

func (f funcStore) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	return f().Complete(ctx, id, token, resp, ttl)
}

func (f funcStore) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	return f().Release(ctx, id, token)
}

func (f funcStore) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	return f().Extend(ctx, id, token, lease)
}

// TestNewAccepts: the bounds themselves, and durations past a century,
// are accepted; a Store of any kind that is not nil works.
func TestNewAccepts(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}}
	for _, cfg := range []engine.Config{
		{},
		{TTL: engine.MinLease},
		{TTL: engine.MinLease, Lease: engine.MinLease},
		{TTL: time.Duration(1<<63 - 1), Lease: time.Duration(1<<63 - 1)},
		{TTL: 200 * 365 * 24 * time.Hour},
		{Abandoned: engine.RefuseAbandoned, Wait: time.Hour, RetryAfter: time.Nanosecond, StoreTimeout: time.Nanosecond, FailOpen: true},
	} {
		e, err := engine.New(store, cfg)
		if err != nil {
			t.Errorf("New(%+v) = %v, want nil", cfg, err)
			continue
		}
		shutdown(t, e)
	}
	s := funcStore(func() *fakeStore { return store })
	e, err := engine.New(s, engine.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDoor{work: keep, store: store}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	shutdown(t, e)
	if store.after() != "completed" {
		t.Errorf("through a func Store, the record is %q, want completed", store.after())
	}
}

// TestObserverPanics: an observer that panics on every event neither stops
// a call nor leaves its key claimed, and is logged once.
func TestObserverPanics(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}}
	var log logs
	e, err := engine.New(store, engine.Config{
		Logger:   slogOf(&log),
		Observer: func(context.Context, engine.Event) { panic("observer") },
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		d := &fakeDoor{work: keep, store: store}
		if p := do(context.Background(), e, engine.ID{Key: "k"}, "fp", d); p != nil {
			t.Fatalf("call %d panicked: %v", i+1, p)
		}
		if want := []string{"Execute", "Send (completed)"}; !equal(d.calls, want) && i == 0 {
			t.Errorf("door calls = %q, want %q", d.calls, want)
		}
		e.Observe(context.Background(), engine.Event{Kind: engine.EventRejected})
	}
	shutdown(t, e)
	if n := log.count("observer panicked"); n != 1 {
		t.Errorf("the observer's panics were logged %d times, want once", n)
	}
}

// TestObserve: a door's own events reach the observer, and nothing happens
// without one.
func TestObserve(t *testing.T) {
	var evs events
	e, err := engine.New(&fakeStore{}, engine.Config{Observer: evs.observe})
	if err != nil {
		t.Fatal(err)
	}
	e.Observe(context.Background(), engine.Event{Kind: engine.EventRejected, Status: 400})
	if ev, ok := evs.final(); !ok || ev.Kind != engine.EventRejected || ev.Status != 400 {
		t.Errorf("observed %+v (%v), want the rejection", ev, ok)
	}
	shutdown(t, e)

	e, err = engine.New(&fakeStore{}, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e.Observe(context.Background(), engine.Event{Kind: engine.EventRejected})
	shutdown(t, e)
}

// TestLogger: the engine's logger, which a door logs through, passes one
// record per message a second.
func TestLogger(t *testing.T) {
	var log logs
	e, err := engine.New(&fakeStore{}, engine.Config{Logger: slogOf(&log)})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	for range 5 {
		e.Logger().Warn("a door's own record")
	}
	e.Logger().Warn("another record")
	if n := log.count("a door's own record"); n != 1 {
		t.Errorf("5 records of one message within a second passed %d times, want once", n)
	}
	if n := log.count("another record"); n != 1 {
		t.Errorf("another message passed %d times, want once", n)
	}
}

// TestEventTimes: the final event counts from the door's start, and its
// durations add up to no more than the call took.
func TestEventTimes(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}}
	var evs events
	e, err := engine.New(store, engine.Config{Observer: evs.observe})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	start := time.Now().Add(-time.Millisecond)
	d := &fakeDoor{work: keep, store: store}
	d.call.Start = start
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	took := time.Since(start)
	ev, _ := evs.final()
	if !ev.Start.Equal(start) {
		t.Errorf("Event.Start = %v, want the door's %v", ev.Start, start)
	}
	if ev.ClaimTook < time.Millisecond || ev.HandlerTook < 0 || ev.StoreTook < 0 {
		t.Errorf("ClaimTook %v, HandlerTook %v, StoreTook %v: want the claim to count from Start, the rest not negative", ev.ClaimTook, ev.HandlerTook, ev.StoreTook)
	}
	if sum := ev.ClaimTook + ev.HandlerTook + ev.StoreTook; sum > took {
		t.Errorf("the durations add up to %v, more than the call's %v", sum, took)
	}
	if d.call.Lease().Token != fresh.Token || d.call.Lease().Key != "k" {
		t.Errorf("Call.Lease() = %+v, want the claim's token and the key", d.call.Lease())
	}

	// Without Start, the event counts from the claim.
	d = &fakeDoor{work: keep, store: store}
	store.claims = []engine.Claim{{Status: engine.Acquired, Token: 9}}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k2"}, "fp", d)
	ev, _ = evs.final()
	if ev.Start.IsZero() || ev.ClaimTook != 0 {
		t.Errorf("without Call.Start: Event.Start %v, ClaimTook %v; want the claim's end, 0", ev.Start, ev.ClaimTook)
	}
}

// refusePanics is a door whose Refuse panics.
type refusePanics struct{ fakeDoor }

func (d *refusePanics) Refuse(error, time.Duration, error) int { panic("refuse") }

// TestRefusePanics: a door that panics while refusing a call still ends it
// for the observer, with the status it would most likely have answered.
func TestRefusePanics(t *testing.T) {
	var evs events
	e, err := engine.New(&fakeStore{claimErr: errDown}, engine.Config{Observer: evs.observe, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	d := &refusePanics{}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the door's panic did not go on")
			}
		}()
		e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	}()
	ev, ok := evs.final()
	if !ok || ev.Kind != engine.EventUnavailable || ev.Status != 503 || !errors.Is(ev.Err, errDown) {
		t.Errorf("final event %+v (%v), want unavailable, 503, the store's error", ev, ok)
	}
}

// TestWorkContext: the work's context carries the lease and the incoming
// key that the client derives downstream keys from, and a Binder's state;
// a context of no work carries no lease.
func TestWorkContext(t *testing.T) {
	store := &bindingStore{fakeStore: fakeStore{claims: []engine.Claim{takeover}}}
	e, err := engine.New(store, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	d := &fakeDoor{work: keep, store: &store.fakeStore}
	id := engine.ID{Scope: "tenant", Key: "k"}
	e.Do(context.Background(), &d.call, id, "fp", d)
	if !d.leased || d.lease.ID != id || d.lease.Token != takeover.Token || d.lease.Abandoned != 2 {
		t.Errorf("the work's lease = %+v (%v); want %v, token %d, 2 abandoned", d.lease, d.leased, id, takeover.Token)
	}
	if in, ok := incoming.FromContext(d.ctx); !ok || in.Scope != "tenant" || in.Key != "k" {
		t.Errorf("the work's incoming key = %+v (%v), want tenant/k", in, ok)
	}
	if got := d.ctx.Value(ctxKey{}); got != "bound" {
		t.Errorf("the work's context holds %v under the Binder's key, want its state", got)
	}
	if store.boundID != id || store.boundToken != takeover.Token {
		t.Errorf("Bind(%v, %d), want the call's id and token", store.boundID, store.boundToken)
	}
	if _, ok := engine.LeaseFromContext(context.Background()); ok {
		t.Error("LeaseFromContext finds a lease in a context of no work")
	}
}

// bindingStore is a Binder: its lease carries state for the work.
type bindingStore struct {
	fakeStore
	boundID    engine.ID
	boundToken engine.Token
}

func (s *bindingStore) Bind(ctx context.Context, id engine.ID, token engine.Token) context.Context {
	s.boundID, s.boundToken = id, token
	return context.WithValue(ctx, ctxKey{}, "bound")
}

// TestStoreWritesKeepValues: the store writes after the work keep the
// caller's values and have the store timeout as their deadline, even once
// the caller is gone.
func TestStoreWritesKeepValues(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}}
	e, err := engine.New(store, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "caller's"))
	defer cancel()
	d := &fakeDoor{work: keep, store: store}
	store.onComplete = func(int) error { cancel(); return nil }
	e.Do(ctx, &d.call, engine.ID{Key: "k"}, "fp", d)
	if store.ctxErr != nil {
		t.Errorf("Complete's context ended with its caller: %v", store.ctxErr)
	}
	if store.ctxValue != "caller's" || !store.deadline {
		t.Errorf("Complete's context: value %v, deadline %v; want the caller's value and a deadline", store.ctxValue, store.deadline)
	}
	if store.after() != "completed" {
		t.Errorf("the record is %q once the caller left during Complete, want completed", store.after())
	}
}

// TestNames: the names the observer and an operator see.
func TestNames(t *testing.T) {
	for k, want := range map[engine.EventKind]string{
		engine.EventExecuted: "executed", engine.EventReplayed: "replayed", engine.EventInFlight: "in_flight",
		engine.EventMismatch: "mismatch", engine.EventRejected: "rejected", engine.EventUnavailable: "unavailable",
		engine.EventReleased: "released", engine.EventNotStored: "not_stored", engine.EventUnprotected: "unprotected",
		engine.EventClientGone: "client_gone", engine.EventLeaseRenewed: "lease_renewed", engine.EventLeaseLost: "lease_lost",
		engine.EventAcquired: "acquired", engine.EventOutcomeUnknown: "outcome_unknown",
		0: "unknown", engine.EventOutcomeUnknown + 1: "unknown", -1: "unknown",
	} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
	for s, want := range map[engine.ClaimStatus]string{
		engine.Acquired: "acquired", engine.InFlight: "in flight", engine.Completed: "completed", 0: "unknown", 9: "unknown",
	} {
		if got := s.String(); got != want {
			t.Errorf("ClaimStatus(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

// TestResponse: the size estimate, and the mark of an "outcome unknown"
// record.
func TestResponse(t *testing.T) {
	r := &engine.Response{Status: 200, Header: map[string][]string{"Ab": {"cd", "e"}}, Body: []byte("0123456789")}
	if got, want := r.Size(), 10+16+2+3; got != want {
		t.Errorf("Size() = %d, want %d", got, want)
	}
	for _, tc := range []struct {
		r    *engine.Response
		want bool
	}{
		{nil, false},
		{&engine.Response{Status: 409}, false},
		{&engine.Response{Header: map[string][]string{engine.HeaderOutcome: {"known"}}}, false},
		{&engine.Response{Header: map[string][]string{engine.HeaderOutcome: {}}}, false},
		{&engine.Response{Header: map[string][]string{engine.HeaderOutcome: {"unknown"}}}, true},
	} {
		if got := tc.r.OutcomeUnknown(); got != tc.want {
			t.Errorf("%+v.OutcomeUnknown() = %v, want %v", tc.r, got, tc.want)
		}
	}
	if !errors.Is(engine.ErrLeaseExpired, engine.ErrLeaseLost) {
		t.Error("ErrLeaseExpired does not wrap ErrLeaseLost")
	}
}
