package consume_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/server"
)

// What a Handler tells the broker after its Func returned.
func ExampleHandler_Decide() {
	effect := func(context.Context, server.ID, []byte) error { return nil }
	h, err := consume.New(effect, consume.WithRetryDelay(time.Second))
	if err != nil {
		panic(err)
	}
	for _, err := range []error{
		nil,                            // ran, or replayed: stored
		errors.New("upstream timeout"), // released: run it again later
		server.ErrInFlight,             // another instance holds it
		server.ErrKeyMismatch,          // a Nats-Msg-Id reused for other data
		server.ErrOutcomeUnknown,       // RefuseAbandoned after a lost holder
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
