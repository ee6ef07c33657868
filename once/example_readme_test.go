package once_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/memstore"
)

// A queue consumer's effect, once per message, as README.md shows it: the
// broker delivers message m-1 twice, and the charge runs once.
func Example_consumer() {
	store, err := memstore.New() // pgstore or redisstore when several consumers share the work
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	runner, err := once.New(store, once.WithConfig(engine.Config{Lease: 30 * time.Second}))
	if err != nil {
		log.Fatal(err)
	}
	defer runner.Shutdown(context.Background())

	charges := 0
	charge := func(ctx context.Context, order string) (string, error) {
		charges++ // the effect
		return "receipt for " + order, nil
	}
	for _, msgID := range []string{"m-1", "m-1"} { // a redelivery
		receipt, err := once.Do(context.Background(), runner, engine.ID{Scope: "payments", Key: msgID}, "order-7",
			func(ctx context.Context) (string, error) {
				return charge(ctx, "order-7") // runs once per msgID
			})
		fmt.Println(receipt, err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// receipt for order-7 <nil>
	// receipt for order-7 <nil>
	// charges: 1
}
