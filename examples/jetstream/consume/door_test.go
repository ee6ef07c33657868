package consume_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
)

// onceDoor makes processes that run the effect through once.Do on their own
// Runner, over store: a process that dies leaves its record as it was. policy
// is what a takeover of an abandoned key gets.
func onceDoor(store engine.Store, policy engine.AbandonedPolicy) func(consume.Func) (process, error) {
	return func(effect consume.Func) (process, error) {
		cut := &cutStore{inner: store}
		r, err := once.New(cut, once.WithConfig(engine.Config{
			Lease: lease, TTL: 10 * time.Minute, StoreTimeout: 5 * time.Second, Abandoned: policy,
			Logger: slog.New(slog.DiscardHandler),
		}))
		if err != nil {
			return process{}, err
		}
		return process{
			run: consume.Once(r, effect),
			die: cut.kill,
			stop: func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = r.Shutdown(ctx)
			},
		}, nil
	}
}

// onceDoorRefusing is onceDoor, with RefuseAbandoned when refuse is set.
func onceDoorRefusing(store engine.Store, refuse bool) func(consume.Func) (process, error) {
	if refuse {
		return onceDoor(store, engine.RefuseAbandoned)
	}
	return onceDoor(store, engine.RerunAbandoned)
}

// TestExactlyOnce: see testExactlyOnce.
func TestExactlyOnce(t *testing.T) { testExactlyOnce(t, onceDoorRefusing) }

// TestDeathInsideEffect: see testDeathInsideEffect.
func TestDeathInsideEffect(t *testing.T) { testDeathInsideEffect(t, onceDoorRefusing) }

// TestDecideOnce checks the decisions for what once returns: a permanent
// error, run or replayed, terminates; a refusal naks after its RetryAfter.
func TestDecideOnce(t *testing.T) {
	r, err := once.New(teststores.Memory(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	declined := errors.New("card declined")
	runs := 0
	fn := consume.Once(r, func(context.Context, engine.ID, []byte) error {
		runs++
		return once.Permanent(declined)
	})
	h, err := consume.New(fn, consume.WithRetryDelay(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	id := engine.ID{Scope: "ORDERS/billing", Key: "order-1"}
	for i := range 2 {
		err := fn(context.Background(), id, []byte("data"))
		if d := h.Decide(context.Background(), err); d.Action != consume.Term {
			t.Errorf("call %d: Decide(%v) = %v, want term", i+1, err, d.Action)
		}
	}
	if runs != 1 {
		t.Errorf("runs = %d, want 1", runs)
	}
	// A refusal in flight, from a Runner whose RetryAfter is 3 s while
	// another call holds the key.
	held, err := once.New(teststores.Memory(t), once.WithConfig(engine.Config{RetryAfter: 3 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Shutdown(context.Background()) })
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := once.Do(context.Background(), held, id, nil, func(context.Context) (int, error) {
			close(entered)
			<-release
			return 1, nil
		})
		done <- err
	}()
	<-entered
	_, inFlight := once.Do(context.Background(), held, id, nil, func(context.Context) (int, error) { return 2, nil })
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inFlight, engine.ErrInFlight) {
		t.Fatalf("second call: %v, want in flight", inFlight)
	}
	err = fmt.Errorf("x: %w", inFlight)
	if d := h.Decide(context.Background(), err); d.Action != consume.Nak || d.Delay != 3*time.Second {
		t.Errorf("Decide(in flight for 3s) = %v after %v, want nak after 3s", d.Action, d.Delay)
	}
}
