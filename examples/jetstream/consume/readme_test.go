package consume_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
)

// TestInFlightNakDelay: a message refused as in flight is asked for again
// after the larger of WithRetryDelay and the refusal's RetryAfter, which is
// the shorter of once's RetryAfter (engine.Config) and the holder's lease left: with
// the defaults, 1 s, however long the holder's lease has left (the README's
// table says so).
func TestInFlightNakDelay(t *testing.T) {
	for _, tc := range []struct {
		name      string
		once      engine.Config // Lease is set to 30 s
		consume   []consume.Option
		wantDelay time.Duration
	}{
		{"defaults", engine.Config{}, nil, time.Second},
		{"no retry delay", engine.Config{}, []consume.Option{consume.WithRetryDelay(0)}, time.Second},
		{"a longer retry delay", engine.Config{}, []consume.Option{consume.WithRetryDelay(5 * time.Second)}, 5 * time.Second},
		// The lease left, 30 s at most, caps once's RetryAfter.
		{"a RetryAfter longer than the lease", engine.Config{RetryAfter: time.Hour}, nil, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.once
			cfg.Lease = 30 * time.Second
			r, err := once.New(teststores.Memory(t), once.WithConfig(cfg))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
			entered, release := make(chan struct{}), make(chan struct{})
			fn := consume.Once(r, func(context.Context, engine.ID, []byte) error {
				close(entered)
				<-release
				return nil
			})
			id := engine.ID{Scope: "ORDERS/billing", Key: "order-1"}
			holder := make(chan error, 1)
			go func() { holder <- fn(context.Background(), id, []byte("data")) }()
			<-entered
			err = fn(context.Background(), id, []byte("data"))
			close(release)
			if err := <-holder; err != nil {
				t.Errorf("holder: %v", err)
			}
			if !errors.Is(err, engine.ErrInFlight) {
				t.Fatalf("the redelivery during the effect: err = %v, want ErrInFlight", err)
			}
			h, err2 := consume.New(fn, tc.consume...)
			if err2 != nil {
				t.Fatal(err2)
			}
			d := h.Decide(context.Background(), err)
			// The lease left may have lost a few milliseconds.
			if d.Action != consume.Nak || d.Delay > tc.wantDelay || d.Delay < tc.wantDelay-time.Second {
				t.Errorf("Decide(in flight) = %v after %v, want nak after %v", d.Action, d.Delay, tc.wantDelay)
			}
		})
	}
}

// TestMirrorScope: a mirror's copy of a message keeps its Nats-Msg-Id but
// is delivered by another stream, so under the default scope (stream and
// consumer) it is another record, and its effect runs again; consumers
// given one scope with WithScope run it once (the README's "The key" says
// so).
func TestMirrorScope(t *testing.T) {
	js, _, subject := newConsumer(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	origin := streamOf(ctx, t, js, subject)
	mirror, _ := uniqueStream(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:    mirror,
		Storage: jetstream.MemoryStorage,
		Mirror:  &jetstream.StreamSource{Name: origin},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, mirror); err != nil {
			t.Errorf("DeleteStream(%s): %v", mirror, err)
		}
	})
	if _, err := js.Publish(ctx, subject, []byte(`{"order":1}`), jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		opts []consume.Option
		want int64
	}{
		{"default scope", nil, 2},
		{"one scope", []consume.Option{consume.WithScope("billing")}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := once.New(teststores.Memory(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
			var effects atomic.Int64
			h, err := consume.New(consume.Once(r, func(context.Context, engine.ID, []byte) error {
				effects.Add(1)
				return nil
			}), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			// A consumer of each stream, named for this run, handles
			// the message's copy there.
			name := "billing-" + map[bool]string{true: "scoped", false: "default"}[len(tc.opts) > 0]
			for _, stream := range []string{origin, mirror} {
				cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
				if err != nil {
					t.Fatal(err)
				}
				msg := next(ctx, t, cons)
				d, err := h.Handle(ctx, msg)
				if err != nil || d.Action != consume.Ack {
					t.Fatalf("Handle(the copy in %s) = %v, %v; want ack", stream, d.Action, err)
				}
			}
			if got := effects.Load(); got != tc.want {
				t.Errorf("effects = %d, want %d", got, tc.want)
			}
		})
	}
}

// streamOf returns the name of the stream that stores subject.
func streamOf(ctx context.Context, t *testing.T, js jetstream.JetStream, subject string) string {
	t.Helper()
	name, err := js.StreamNameBySubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// next returns the next message of cons, waiting for it (a mirror copies
// the message some time after it is published).
func next(ctx context.Context, t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			return msg
		}
	}
	t.Fatal("no message within the test's timeout")
	return nil
}
