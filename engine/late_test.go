package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// lateCall runs one call of work with a store prepared by setup, whose
// Claim acquires the key; the writes of its store fail as setup says.
type lateCall struct {
	e     *engine.Engine
	store *fakeStore
	door  *fakeDoor
	log   logs
	evs   events
}

func newLateCall(t *testing.T, lease time.Duration, w work, setup func(*fakeStore)) *lateCall {
	t.Helper()
	c := &lateCall{store: &fakeStore{claims: []engine.Claim{fresh}}}
	if setup != nil {
		setup(c.store)
	}
	e, err := engine.New(c.store, engine.Config{Lease: lease, StoreTimeout: 30 * time.Millisecond, Logger: slogOf(&c.log), Observer: c.evs.observe})
	if err != nil {
		t.Fatal(err)
	}
	c.e = e
	c.door = &fakeDoor{work: w, store: c.store}
	return c
}

func (c *lateCall) do() {
	c.e.Do(context.Background(), &c.door.call, engine.ID{Key: "k"}, "fp", c.door)
}

// logged fails t unless a message containing part was logged.
func (c *lateCall) logged(t *testing.T, part string) {
	t.Helper()
	if c.log.count(part) == 0 {
		c.log.mu.Lock()
		defer c.log.mu.Unlock()
		t.Errorf("no log record %q among %q", part, c.log.msgs)
	}
}

// TestLateComplete: a result that the store did not take within the store
// timeout is answered, then stored in the background, and Shutdown waits
// for it; a retry meanwhile is refused as in flight, because the lease is
// still renewed.
func TestLateComplete(t *testing.T) {
	c := newLateCall(t, 600*time.Millisecond, keep, func(s *fakeStore) { s.completeErr = errDown })
	c.do()
	if got, want := c.door.calls, []string{"Execute", "Send (in flight)"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
	// The renewal went with the late Complete: the lease outlives the call.
	n := c.store.extends()
	if !waitFor(context.Background(), func() bool { return c.store.extends() > n }) {
		t.Error("the lease was not renewed while the result waited to be stored")
	}
	c.store.heal()
	shutdown(t, c.e)
	if got := c.store.after(); got != "completed" {
		t.Errorf("the record is %q, want completed", got)
	}
	c.logged(t, "stored after it was sent")
	if ev, _ := c.evs.final(); ev.Kind != engine.EventNotStored || !errors.Is(ev.Err, errDown) {
		t.Errorf("final event %v (%v), want not stored, with the store's error", ev.Kind, ev.Err)
	}
}

// TestLateCompleteEnds: a late Complete ends when the store refuses it for
// good, or after one lease: the key then stays in flight until its lease
// ends, and a retry after that runs the work again.
func TestLateCompleteEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		then  error // the store's answer once the call returned
		log   string
		after string
	}{
		{"taken over", engine.ErrLeaseLost, "or the key was taken over", "in flight"},
		{"store closed", engine.ErrStoreClosed, "the store was closed", "in flight"},
		{"down for a lease", errDown, "never stored", "in flight"},
		{"not storable", nil, "stored after it was sent", "completed, body omitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newLateCall(t, lease(tc.then), keep, func(s *fakeStore) { s.completeErr = errDown })
			c.do()
			c.store.set(func(s *fakeStore) { s.completeErr, s.notStorable = tc.then, tc.then == nil })
			shutdown(t, c.e)
			c.logged(t, tc.log)
			if got := c.store.after(); got != tc.after {
				t.Errorf("the record is %q, want %q", got, tc.after)
			}
		})
	}
}

// lease is the lease of a call whose late write ends with then: short when
// it ends only with the lease.
func lease(then error) time.Duration {
	if then == errDown {
		return 50 * time.Millisecond
	}
	return 2 * time.Second
}

// TestShutdownGivesUp: Shutdown stops the late writes when its context
// ends first, and says so; their keys stay in flight. A second Shutdown
// returns at once.
func TestShutdownGivesUp(t *testing.T) {
	c := newLateCall(t, time.Minute, keep, func(s *fakeStore) { s.completeErr = errDown })
	c.do()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := c.e.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "engine: shutdown: ") {
		t.Errorf("Shutdown = %v, want engine: shutdown: context deadline exceeded", err)
	}
	c.logged(t, "Shutdown gave up")
	if got := c.store.after(); got != "in flight" {
		t.Errorf("the record is %q, want in flight", got)
	}
	if err := c.e.Shutdown(context.Background()); err != nil {
		t.Errorf("a second Shutdown = %v, want nil", err)
	}
}

// TestShutdownIdle: with nothing to store, Shutdown returns at once, as
// often as it is called, even with a context already ended.
func TestShutdownIdle(t *testing.T) {
	e, err := engine.New(&fakeStore{}, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 2 {
		if err := e.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown #%d = %v, want nil", i+1, err)
		}
	}
	if err := e.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown(ended) = %v, want nil or its context's error", err)
	}
}

// TestLateCompleteAfterShutdown: after Shutdown, a late Complete runs on
// the call's goroutine, after an answer sent at once (Send with now): the
// result is still stored, and nothing runs twice.
func TestLateCompleteAfterShutdown(t *testing.T) {
	c := newLateCall(t, time.Minute, keep, nil)
	// The store fails every Complete until the caller has been answered.
	c.store.onComplete = func(int) error {
		if len(c.door.calls) < 2 {
			return errDown
		}
		return nil
	}
	shutdown(t, c.e)
	c.do()
	if got, want := c.door.calls, []string{"Execute", "Send(now) (in flight)"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
	if got := c.store.after(); got != "completed" {
		t.Errorf("the record is %q when Do returns, want completed", got)
	}
	c.logged(t, "on the call's goroutine")
}

// TestLateRelease: a Release that the store did not take within the store
// timeout is tried again in the background, so that the retry runs the
// work again rather than being told of an abandoned holder.
func TestLateRelease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		then  error
		log   string
		after string
	}{
		{"store back", nil, "released after the store came back", "released"},
		{"taken over", engine.ErrLeaseLost, "or the key was taken over", "in flight"},
		{"store closed", engine.ErrStoreClosed, "not released: the store was closed", "in flight"},
		{"down for a lease", errDown, "never released", "in flight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newLateCall(t, lease(tc.then), giveBack, func(s *fakeStore) { s.releaseErr = errDown })
			c.do()
			if got, want := c.door.calls, []string{"Execute", "Send (in flight)"}; !equal(got, want) {
				t.Errorf("door calls = %q, want %q", got, want)
			}
			c.logged(t, "tried again in the background")
			c.store.set(func(s *fakeStore) { s.releaseErr = tc.then })
			shutdown(t, c.e)
			c.logged(t, tc.log)
			if got := c.store.after(); got != tc.after {
				t.Errorf("the record is %q, want %q", got, tc.after)
			}
		})
	}
}

// TestReleaseAfterShutdown: after Shutdown, a Release that failed is not
// tried again: the key stays in flight until its lease ends.
func TestReleaseAfterShutdown(t *testing.T) {
	c := newLateCall(t, time.Minute, giveBack, func(s *fakeStore) { s.releaseErr = errDown })
	shutdown(t, c.e)
	c.do()
	if got, want := c.door.calls, []string{"Execute", "Send (in flight)"}; !equal(got, want) {
		t.Errorf("door calls = %q, want %q", got, want)
	}
	c.logged(t, "retries are refused as in flight until its lease expires")
	if got := c.store.after(); got != "in flight" {
		t.Errorf("the record is %q, want in flight", got)
	}
}
