package vendors_test

import (
	"fmt"
	"log"
	"net/http"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/vendors"
)

// One Client for three APIs, each with its own rules, chosen by host, as
// README.md shows it.
func Example_byHost() {
	client, err := idempotency.NewClient(idempotency.WithDialect(func(req *http.Request) idempotency.Dialect {
		switch req.URL.Hostname() {
		case "api.stripe.com":
			return vendors.Stripe() // Idempotency-Key ≤ 255, Idempotent-Replayed, 400 idempotency_error
		case "api-m.paypal.com":
			return vendors.PayPal() // PayPal-Request-Id, DUPLICATE_REQUEST_ID
		case "myacs.communication.azure.com":
			return vendors.Azure() // OASIS: Repeatability-Request-ID + Repeatability-First-Sent
		}
		return idempotency.Dialect{} // this library's own
	}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(client != nil)
	// Output: true
}
