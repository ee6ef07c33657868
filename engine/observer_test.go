package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

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
