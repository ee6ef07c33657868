package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/incoming"
)

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
