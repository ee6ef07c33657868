package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

type valueKey struct{}

func TestDetached(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), valueKey{}, "v"))
	cancel()
	var d detached
	d.init(parent, 50*time.Millisecond)
	defer d.stop()
	if got := d.Value(valueKey{}); got != "v" {
		t.Errorf("Value = %v, want the parent's value", got)
	}
	if err := d.Err(); err != nil {
		t.Fatalf("Err = %v before the deadline, though the parent is cancelled; want nil", err)
	}
	if _, ok := d.Deadline(); !ok {
		t.Error("Deadline not set")
	}
	child, stopChild := context.WithCancel(&d)
	defer stopChild()
	select {
	case <-d.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after the deadline")
	}
	if err := d.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err = %v after the deadline, want DeadlineExceeded", err)
	}
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a derived context was not cancelled at the deadline")
	}
}

func TestDetachedErrWithoutDone(t *testing.T) {
	var d detached
	d.init(context.Background(), -time.Second)
	if err := d.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err past the deadline = %v, want DeadlineExceeded", err)
	}
	select {
	case <-d.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done made past the deadline is not closed")
	}
	d.stop()
}

func TestDetachedExpireNow(t *testing.T) {
	for _, askDone := range []bool{false, true} {
		var d detached
		d.init(context.Background(), time.Hour)
		if askDone {
			d.Done()
		}
		d.expireNow()
		d.expireNow() // twice is fine
		select {
		case <-d.Done():
		default:
			t.Fatalf("Done not closed after expireNow (Done asked before: %v)", askDone)
		}
		if err := d.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Err after expireNow = %v, want DeadlineExceeded", err)
		}
		d.stop()
	}
}

// TestDetachedLazy: a detached context makes its Done channel and timer
// only when a Store asks for Done, and stop releases the timer.
func TestDetachedLazy(t *testing.T) {
	var d detached
	d.init(context.Background(), time.Hour)
	if d.Err() != nil {
		t.Fatalf("Err = %v an hour before the deadline", d.Err())
	}
	if d.done != nil || d.timer != nil {
		t.Fatal("a channel or a timer made before Done was asked for")
	}
	done := d.Done()
	if d.timer == nil {
		t.Fatal("no timer behind Done")
	}
	if d.Done() != done {
		t.Error("Done returns another channel the second time")
	}
	d.stop()
	if d.timer.Stop() {
		t.Error("the timer still runs after stop")
	}
	select {
	case <-done:
		t.Error("Done closed by stop; only the deadline or expireNow close it")
	default:
	}
}

// TestDetachedExpireAfterExpireNow: the timer that fires after expireNow
// closed Done does nothing.
func TestDetachedExpireAfterExpireNow(t *testing.T) {
	var d detached
	d.init(context.Background(), time.Hour)
	d.Done()
	d.expireNow()
	d.expire() // as the timer would, had it fired before being stopped
	if err := d.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err = %v, want DeadlineExceeded", err)
	}
	d.stop()
}

// TestDetachedDeadline: the deadline is the timeout from init.
func TestDetachedDeadline(t *testing.T) {
	var d detached
	before := time.Now()
	d.init(context.Background(), time.Minute)
	dl, ok := d.Deadline()
	if !ok || dl.Before(before.Add(time.Minute)) || dl.After(time.Now().Add(time.Minute)) {
		t.Errorf("Deadline = %v, %v; want a minute from init", dl, ok)
	}
}

// TestDetachedAfterFunc: context.AfterFunc registers its function with the
// detached context (no goroutine waits on Done), runs it at the deadline,
// and its stop keeps it from running.
func TestDetachedAfterFunc(t *testing.T) {
	var d detached
	d.init(context.Background(), time.Hour)
	stop := context.AfterFunc(&d, func() { t.Error("a stopped function ran") })
	if len(d.after) != 1 {
		t.Fatalf("%d functions registered with the context, want 1: context.AfterFunc did not use its AfterFunc", len(d.after))
	}
	if !stop() {
		t.Fatal("stop = false before the deadline, want true")
	}
	if stop() {
		t.Error("stop = true the second time, want false")
	}
	if len(d.after) != 0 {
		t.Errorf("%d functions registered after stop, want 0", len(d.after))
	}
	d.expireNow() // runs only what is registered: nothing
	d.stop()

	var e detached
	e.init(context.Background(), 20*time.Millisecond)
	ran2 := make(chan struct{})
	stop = context.AfterFunc(&e, func() { close(ran2) })
	select {
	case <-ran2:
	case <-time.After(5 * time.Second):
		t.Fatal("the function did not run at the deadline")
	}
	if stop() {
		t.Error("stop = true after the function ran, want false")
	}
	e.stop()

	// On a context already done, the function runs at once.
	var f detached
	f.init(context.Background(), -time.Second)
	ran3 := make(chan struct{})
	if context.AfterFunc(&f, func() { close(ran3) })() {
		t.Error("stop = true on a context that was done, want false")
	}
	select {
	case <-ran3:
	case <-time.After(5 * time.Second):
		t.Fatal("the function did not run on a context already done")
	}
}
