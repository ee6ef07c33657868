package consume_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
)

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
