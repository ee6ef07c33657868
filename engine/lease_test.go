package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// kept is the work's answer that the lease tests keep.
var kept = engine.Outcome{Response: &engine.Response{Status: 200}, Status: 200}

// waitFor waits until ok holds, for ten seconds at most, or until ctx
// ends.
func waitFor(ctx context.Context, ok func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return ok()
		}
	}
	return true
}

// TestLeaseRenewed: the lease is extended every third of its length while
// the work runs, so that the work outlives its first lease with its context
// alive, and each renewal is an event.
func TestLeaseRenewed(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}}
	var evs events
	lease := 600 * time.Millisecond
	e, err := engine.New(store, engine.Config{Lease: lease, Observer: evs.observe, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	var alive error
	var ran time.Duration
	d := &fakeDoor{work: custom, store: store, run: func(ctx context.Context) engine.Outcome {
		start := time.Now()
		if !waitFor(ctx, func() bool { return store.extends() >= 4 }) {
			t.Error("fewer than 4 Extends in ten seconds")
		}
		ran, alive = time.Since(start), context.Cause(ctx)
		return kept
	}}
	e.Do(context.Background(), &d.call, engine.ID{Scope: "s", Key: "k"}, "fp", d)
	if alive != nil {
		t.Errorf("the work's context ended after %v, under a lease of %v renewed every third: %v", ran, lease, alive)
	}
	n := 0
	for _, k := range evs.kinds() {
		if k == engine.EventLeaseLost {
			t.Error("EventLeaseLost for a lease renewed every time")
		}
	}
	evs.mu.Lock()
	for _, ev := range evs.all {
		if ev.Kind == engine.EventLeaseRenewed {
			n++
			if ev.Key != "k" || ev.Scope != "s" || ev.Start.IsZero() || ev.StoreTook < 0 {
				t.Errorf("renewal event %+v, want the key, its start and how long the Extend took", ev)
			}
		}
	}
	evs.mu.Unlock()
	if n < 4 {
		t.Errorf("%d renewal events, want one per Extend (4 at least)", n)
	}
	if got := store.after(); got != "completed" {
		t.Errorf("the record is %q, want completed", got)
	}
}

// TestLeaseRenewedAfterItEnded: once the lease ended without a renewal and
// the work's context was cancelled, the renewal goes on trying: a store
// that comes back before anyone took the key over grants the lease again,
// and the work's result is stored.
func TestLeaseRenewedAfterItEnded(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}, extendErr: errDown}
	renewed := make(chan struct{}, 100)
	var evs events
	e, err := engine.New(store, engine.Config{Lease: 150 * time.Millisecond, Logger: quiet, Observer: func(ctx context.Context, ev engine.Event) {
		evs.observe(ctx, ev)
		if ev.Kind == engine.EventLeaseRenewed {
			renewed <- struct{}{}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	var cause error
	d := &fakeDoor{work: custom, store: store, run: func(ctx context.Context) engine.Outcome {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("the work's context did not end with its lease")
		}
		cause = context.Cause(ctx)
		store.set(func(s *fakeStore) { s.extendErr = nil })
		select {
		case <-renewed:
		case <-time.After(10 * time.Second):
			t.Error("the lease was not renewed once the store came back")
		}
		return kept
	}}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	if !errors.Is(cause, engine.ErrLeaseExpired) || !errors.Is(cause, errDown) {
		t.Errorf("the work's context ended with %v, want ErrLeaseExpired and the last renewal's error", cause)
	}
	if got, want := d.calls, []string{"Execute", "Send (completed)"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
	if ev, _ := evs.final(); ev.Kind != engine.EventExecuted {
		t.Errorf("final event %v, want executed", ev.Kind)
	}
}

// TestExtendNeverAnswers: an Extend that hangs does not keep the lease: the
// work's context ends at the lease's end.
func TestExtendNeverAnswers(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}, onExtend: func(ctx context.Context, n int) { <-ctx.Done() }}
	e, err := engine.New(store, engine.Config{Lease: 150 * time.Millisecond, StoreTimeout: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	var cause error
	d := &fakeDoor{work: custom, store: store, run: func(ctx context.Context) engine.Outcome {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("the work's context did not end with its lease")
		}
		cause = context.Cause(ctx)
		return engine.Outcome{Reason: "gave up", Cause: cause}
	}}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	if !errors.Is(cause, engine.ErrLeaseExpired) {
		t.Errorf("the work's context ended with %v, want ErrLeaseExpired", cause)
	}
	if got, want := d.calls, []string{"Execute", "Refuse(unavailable, 1s)"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
}

// TestExtendCutShort: an Extend in progress when the call ends is cut short
// through its context, and returns before the call does.
func TestExtendCutShort(t *testing.T) {
	started := make(chan struct{})
	var returned bool
	var endedAt, deadline time.Time
	store := &fakeStore{claims: []engine.Claim{fresh}, onExtend: func(ctx context.Context, n int) {
		if n == 1 {
			close(started)
		}
		<-ctx.Done()
		endedAt = time.Now()
		deadline, _ = ctx.Deadline()
		returned = true
	}}
	e, err := engine.New(store, engine.Config{Lease: 900 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	d := &fakeDoor{work: custom, store: store, run: func(ctx context.Context) engine.Outcome {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Error("no Extend in ten seconds")
		}
		return kept
	}}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	if !returned {
		t.Fatal("Do returned before the Extend in progress")
	}
	if !endedAt.Before(deadline) {
		t.Errorf("the Extend ended at its deadline, %v after it; want it cut short", endedAt.Sub(deadline))
	}
	if got := store.after(); got != "completed" {
		t.Errorf("the record is %q, want completed", got)
	}
}
