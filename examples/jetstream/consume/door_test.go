//go:build oncelanded

package consume_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/server"
)

// onceDoor makes processes that run the effect through once.Do on their own
// Runner, over store: a process that dies leaves its record as it was.
func onceDoor(store server.Store, opts ...once.Option) func(consume.Func) (process, error) {
	return func(effect consume.Func) (process, error) {
		cut := &cutStore{inner: store}
		r, err := once.New(cut, append([]once.Option{
			once.WithLease(lease),
			once.WithTTL(10 * time.Minute),
			once.WithStoreTimeout(5 * time.Second),
		}, opts...)...)
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
func onceDoorRefusing(store server.Store, refuse bool) func(consume.Func) (process, error) {
	if refuse {
		return onceDoor(store, once.WithAbandoned(engine.RefuseAbandoned))
	}
	return onceDoor(store)
}

// TestExactlyOnce: see testExactlyOnce.
func TestExactlyOnce(t *testing.T) { testExactlyOnce(t, onceDoorRefusing) }

// TestDeathInsideEffect: see testDeathInsideEffect.
func TestDeathInsideEffect(t *testing.T) { testDeathInsideEffect(t, onceDoorRefusing) }
