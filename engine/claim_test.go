package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// TestAwaitCallerLeaves: a caller that leaves while it waits for the holder
// in flight gets no answer, and its call ends as gone.
func TestAwaitCallerLeaves(t *testing.T) {
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	store := &fakeStore{claims: []engine.Claim{live}, onClaim: func(n int) {
		if n == 2 {
			leave()
		}
	}}
	var evs events
	e, err := engine.New(store, engine.Config{Wait: time.Hour, Observer: evs.observe})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	d := &fakeDoor{store: store}
	e.Do(ctx, &d.call, engine.ID{Key: "k"}, "fp", d)
	if len(d.calls) != 0 {
		t.Errorf("door calls = %q, want none", d.calls)
	}
	if ev, _ := evs.final(); ev.Kind != engine.EventClientGone || !errors.Is(ev.Err, context.Canceled) {
		t.Errorf("final event %v (%v), want client gone, canceled", ev.Kind, ev.Err)
	}
}

// TestAwaitBehindClock: a store whose clock is behind reports a lease with
// time left below zero; the wait still asks again no faster than a
// millisecond at a time, and ends with the holder's result.
func TestAwaitBehindClock(t *testing.T) {
	behind := engine.Claim{Status: engine.InFlight, Fingerprint: "fp", RetryAfter: -time.Hour}
	store := &fakeStore{claims: []engine.Claim{behind, behind, behind, stored}}
	e, err := engine.New(store, engine.Config{Wait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	d := &fakeDoor{store: store}
	start := time.Now()
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	if got, want := d.calls, []string{"Replay"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
	if took := time.Since(start); took < 3*time.Millisecond {
		t.Errorf("three waits took %v, less than a millisecond each", took)
	}
	if store.nClaims != 4 {
		t.Errorf("%d claims, want 4", store.nClaims)
	}
}

// TestAwaitTakesOver: a call that waits for a holder whose lease ends takes
// the key over and runs, as its Lease says.
func TestAwaitTakesOver(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{live, takeover}}
	e, err := engine.New(store, engine.Config{Wait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	d := &fakeDoor{work: keep, store: store}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	if got, want := d.calls, []string{"Execute", "Send (completed)"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
	if d.lease.Abandoned != 2 {
		t.Errorf("the work's lease counts %d abandoned holders, want 2", d.lease.Abandoned)
	}
}
