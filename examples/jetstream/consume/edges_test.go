package consume_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/memstore"
)

// newOnce returns a Runner on store, shut down when t ends.
func newOnce(t *testing.T, store engine.Store, opts ...once.Option) *once.Runner {
	t.Helper()
	r, err := once.New(store, append([]once.Option{once.WithConfig(engine.Config{Logger: slog.New(slog.DiscardHandler)})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return r
}

// TestPermanentErrorTooLargeTerminated: a message whose effect failed for
// good, with an error too large for the store to keep, is terminated when it
// is delivered again (the first delivery's Term was lost), not acknowledged
// as if its effect had succeeded; the effect runs once.
func TestPermanentErrorTooLargeTerminated(t *testing.T) {
	const wait = 300 * time.Millisecond
	js, cons, subject := newConsumer(t, wait)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, subject, []byte("order"), jetstream.WithMsgID("declined-1")); err != nil {
		t.Fatal(err)
	}
	// A store whose byte bound the error's message exceeds: it keeps the
	// record's status, without its body.
	r := newOnce(t, teststores.Memory(t, memstore.WithMaxBytes(4<<10)))
	runs := 0
	h, err := consume.New(consume.Once(r, func(context.Context, engine.ID, []byte) error {
		runs++
		return once.Permanent(errors.New("card declined: " + strings.Repeat("x", 64<<10)))
	}))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := h.Process(ctx, msg); d.Action != consume.Term {
		t.Fatalf("first delivery: Process() = %v (%v), want term", d.Action, d.Err)
	}
	// The Term is lost: the broker delivers the message again after
	// AckWait.
	msg, err = cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no redelivery: %v", err)
	}
	d, err := h.Handle(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Action != consume.Term {
		t.Errorf("redelivery: Handle() = %v (%v), want term: the effect failed for good", d.Action, d.Err)
	}
	if !errors.Is(d.Err, once.ErrPermanent) {
		t.Errorf("redelivery: Err = %v, want one matching once.ErrPermanent", d.Err)
	}
	if runs != 1 {
		t.Errorf("effect runs = %d, want 1", runs)
	}
}

// TestProgressStopsOnPanic: an effect that panics under WithProgress stops
// the progress reports (their goroutine ends), and the panic goes on to
// the caller; the message, no longer said to be in progress, is delivered
// again after AckWait, and runs again (the door released its key).
func TestProgressStopsOnPanic(t *testing.T) {
	// Checked last, once the connection and the stream are gone.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	const wait = 300 * time.Millisecond
	js, cons, subject := newConsumer(t, wait)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, subject, []byte("order"), jetstream.WithMsgID("panics-1")); err != nil {
		t.Fatal(err)
	}
	r := newOnce(t, teststores.Memory(t))
	runs := 0
	h, err := consume.New(consume.Once(r, func(context.Context, engine.ID, []byte) error {
		if runs++; runs == 1 {
			panic("effect")
		}
		return nil
	}), consume.WithProgress(wait/4))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	recovered := func() (v any) {
		defer func() { v = recover() }()
		_, _ = h.Handle(ctx, msg)
		return nil
	}()
	if recovered != "effect" {
		t.Fatalf("Handle() recovered %v, want the effect's panic", recovered)
	}
	// Without progress reports, the broker delivers it again after
	// AckWait; with them going on, it never would (10 s is 33 AckWaits).
	msg, err = cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no redelivery after the panic: %v", err)
	}
	d, err := h.Handle(ctx, msg)
	if err != nil || d.Action != consume.Ack {
		t.Errorf("redelivery: Handle() = %v, %v, want ack", d.Action, err)
	}
	if runs != 2 {
		t.Errorf("effect runs = %d, want 2", runs)
	}
}
