package vendors_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/vendors"
)

// A Client that speaks Stripe's rules to Stripe's host and this module's
// own to every other. Here a server that answers as Stripe does stands in
// for api.stripe.com: its first answer is a 500 that it keeps for the key
// (Stripe saves the result of the first request, errors included), and the
// retry gets it again, marked Idempotent-Replayed: true; a key reused with
// another payload is refused with an idempotency_error.
func Example() {
	var calls atomic.Int32
	stripe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), "amount=20"):
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"type":"idempotency_error"}}`)
		case calls.Add(1) > 1:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer stripe.Close()

	client, err := idempotency.NewClient(
		idempotency.WithHTTPClient(stripe.Client()),
		idempotency.WithBackoff(0, 0),
		idempotency.WithDialect(func(req *http.Request) idempotency.Dialect {
			if req.URL.Host == strings.TrimPrefix(stripe.URL, "http://") { // "api.stripe.com" in production
				return vendors.Stripe()
			}
			return idempotency.Dialect{}
		}))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := idempotency.ContextWithKey(context.Background(), idempotency.NewKey())
	for _, body := range []string{"amount=10", "amount=20"} {
		resp, err := client.Post(ctx, stripe.URL+"/v1/charges", "application/x-www-form-urlencoded", strings.NewReader(body))
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		out, _ := idempotency.OutcomeOf(resp)
		fmt.Println(resp.StatusCode, "attempts:", out.Attempts, "replayed:", out.Replayed, "stopped:", out.Stopped)
	}
	// Output:
	// 201 attempts: 2 replayed: true stopped: <nil>
	// 400 attempts: 1 replayed: false stopped: server says the key was used for another request
}
