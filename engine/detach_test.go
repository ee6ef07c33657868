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
