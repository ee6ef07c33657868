package consume_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/pgstore"
)

// payments stands for a payment provider's client.
var payments paymentProvider

type paymentProvider struct{}

// Charged reports whether the order was charged.
func (paymentProvider) Charged(context.Context, string) (bool, error) { return false, nil }

// Charge charges the order.
func (paymentProvider) Charge(context.Context, string, []byte) error { return nil }

// A service that charges each order of a stream once: its instances share
// the records in PostgreSQL and bind to one durable consumer. It needs
// PostgreSQL and a NATS server with JetStream, and a stream ORDERS, so it is
// compiled, not run (main.go runs one against memstore).
func ExampleOnce() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool) // shared by every instance of the service
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	runner, err := once.New(store, once.WithConfig(engine.Config{
		TTL:   24 * time.Hour, // see "How long records live" below
		Lease: 30 * time.Second,
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer runner.Shutdown(context.Background())
	charge := func(ctx context.Context, id engine.ID, data []byte) error {
		lease, _ := engine.LeaseFromContext(ctx)
		if lease.Abandoned > 0 {
			// An earlier holder died, maybe after charging: look first.
			if charged, err := payments.Charged(ctx, id.Key); err != nil || charged {
				return err
			}
		}
		return payments.Charge(ctx, id.Key, data) // id.Key: the Nats-Msg-Id
	}
	const ackWait = time.Minute // longer than the lease
	h, err := consume.New(consume.Once(runner, charge),
		consume.WithProgress(ackWait/3)) // keeps a long effect from being redelivered
	if err != nil {
		log.Fatal(err)
	}

	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:   "billing",
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   ackWait,
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		d, err := h.Handle(ctx, msg)
		if d.Action == consume.Term {
			log.Printf("terminated %s: %s", msg.Headers().Get(jetstream.MsgIDHeader), d.Reason)
		}
		_ = err // a lost ack is answered by the door on redelivery
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	<-ctx.Done()
}

// What a Handler tells the broker after its Func returned.
func ExampleHandler_Decide() {
	effect := func(context.Context, engine.ID, []byte) error { return nil }
	h, err := consume.New(effect, consume.WithRetryDelay(time.Second))
	if err != nil {
		panic(err)
	}
	for _, err := range []error{
		nil,                            // ran, or replayed: stored
		errors.New("upstream timeout"), // released: run it again later
		engine.ErrInFlight,             // another instance holds it
		engine.ErrKeyMismatch,          // a Nats-Msg-Id reused for other data
		engine.ErrOutcomeUnknown,       // RefuseAbandoned after a lost holder
	} {
		d := h.Decide(context.Background(), err)
		fmt.Println(d.Action, d.Delay)
	}
	// Output:
	// ack 0s
	// nak 1s
	// nak 1s
	// term 0s
	// term 0s
}
