// Command jetstream consumes orders from a NATS JetStream stream and charges
// each one at most once, however often the broker delivers it, with the
// function door of package once keyed by the publisher's Nats-Msg-Id (see
// package consume for the key and the acknowledgements).
//
// It creates a stream of its own, publishes a few orders (one of them twice,
// as a publisher that retried would: the stream drops the copy), consumes
// them, and loses the acknowledgement of the first delivery of one order, as
// a process that died after the charge and before its ack would: the broker
// delivers that order again after AckWait, and the door answers it from the
// stored result without charging again. The stream is deleted at the end.
//
// # Try it
//
// With a NATS server with JetStream on 127.0.0.1:4222 (nats-server -js):
//
//	go run . -orders 3
//
// It prints each charge, the replay of the redelivered order, and
// "published 3 orders, 4 deliveries, 3 charges".
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/memstore"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.url, "url", nats.DefaultURL, "NATS server URL")
	flag.IntVar(&cfg.orders, "orders", 3, "orders to publish")
	flag.DurationVar(&cfg.ackWait, "ack-wait", time.Second, "consumer's AckWait")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		log.Fatal(err)
	}
}

type config struct {
	url     string
	orders  int
	ackWait time.Duration
}

// summary is what run counted.
type summary struct {
	published, deliveries, charges, replays int
}

func run(ctx context.Context, w io.Writer, cfg config) error {
	_, err := runSummary(ctx, w, cfg)
	return err
}

func runSummary(ctx context.Context, w io.Writer, cfg config) (summary, error) {
	var sum summary
	if cfg.orders < 2 {
		return sum, errors.New("jetstream: -orders must be at least 2")
	}
	nc, err := nats.Connect(cfg.url)
	if err != nil {
		return sum, fmt.Errorf("jetstream: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return sum, fmt.Errorf("jetstream: %w", err)
	}

	// A stream of its own, so that the example can run beside anything.
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return sum, err
	}
	suffix := hex.EncodeToString(b)
	name, subject := "ORDERS_EXAMPLE_"+strings.ToUpper(suffix), "orders-example."+suffix
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{subject},
		Storage:  jetstream.MemoryStorage,
		// The window in which the stream drops a message whose
		// Nats-Msg-Id it has seen: the idempotency records' TTL must
		// outlive it, and the consumer's redeliveries.
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return sum, fmt.Errorf("jetstream: create stream: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	}()
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:   "billing",
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   cfg.ackWait,
	})
	if err != nil {
		return sum, fmt.Errorf("jetstream: create consumer: %w", err)
	}

	// The idempotency records. A real service shares them between its
	// instances: pgstore or redisstore.
	store, err := memstore.New()
	if err != nil {
		return sum, err
	}
	defer store.Close()
	runner, err := once.New(store, once.WithConfig(engine.Config{TTL: 24 * time.Hour}))
	if err != nil {
		return sum, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = runner.Shutdown(ctx)
	}()

	var mu sync.Mutex // guards sum.charges
	charge := func(ctx context.Context, id engine.ID, data []byte) error {
		mu.Lock()
		defer mu.Unlock()
		sum.charges++
		fmt.Fprintf(w, "charged %s: %s\n", id.Key, data)
		return nil
	}
	h, err := consume.New(consume.Once(runner, charge), consume.WithProgress(cfg.ackWait/3))
	if err != nil {
		return sum, err
	}

	for i := range cfg.orders {
		id := fmt.Sprintf("order-%d", i+1)
		data := fmt.Appendf(nil, `{"order":%d,"amount":%d}`, i+1, 10*(i+1))
		if _, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(id)); err != nil {
			return sum, fmt.Errorf("jetstream: publish %s: %w", id, err)
		}
		sum.published++
	}
	// A publisher that did not see its PubAck sends again: the stream
	// drops the copy, by its Nats-Msg-Id.
	ack, err := js.Publish(ctx, subject, []byte(`{"order":1,"amount":10}`), jetstream.WithMsgID("order-1"))
	if err != nil {
		return sum, fmt.Errorf("jetstream: publish again: %w", err)
	}
	fmt.Fprintf(w, "published order-1 again: duplicate=%v\n", ack.Duplicate)

	charges := func() int {
		mu.Lock()
		defer mu.Unlock()
		return sum.charges
	}
	// Consume calls the handler on one goroutine, one message at a time.
	acked := make(chan struct{})
	acks := 0
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		md, err := msg.Metadata()
		if err != nil {
			return
		}
		key := msg.Headers().Get(jetstream.MsgIDHeader)
		before := charges()
		d := h.Process(ctx, msg)
		sum.deliveries++
		if d.Action == consume.Ack && charges() == before {
			sum.replays++
			fmt.Fprintf(w, "replayed %s (delivery %d): not charged again\n", key, md.NumDelivered)
		}
		if key == "order-2" && md.NumDelivered == 1 {
			// The ack is lost, as when the process dies after the
			// charge: the broker delivers order-2 again after AckWait.
			fmt.Fprintf(w, "lost the ack of %s\n", key)
			return
		}
		if err := d.Settle(msg); err != nil {
			fmt.Fprintf(w, "%s: %v\n", key, err)
			return
		}
		if d.Action == consume.Ack {
			if acks++; acks == cfg.orders {
				close(acked)
			}
		}
	})
	if err != nil {
		return sum, fmt.Errorf("jetstream: consume: %w", err)
	}
	select {
	case <-acked:
	case <-ctx.Done():
	}
	cc.Stop()
	<-cc.Closed()
	fmt.Fprintf(w, "published %d orders, %d deliveries, %d charges\n", sum.published, sum.deliveries, sum.charges)
	if ctx.Err() != nil {
		return sum, fmt.Errorf("jetstream: %w", context.Cause(ctx))
	}
	return sum, nil
}
