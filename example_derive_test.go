package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/incoming"
)

// A handler behind the middleware of package server charges a payment
// provider. Its calls carry keys derived from its own incoming key, so that
// when it runs again (its first holder died after charging, and a retry
// took the key over), the provider sees the same keys and charges once.
func ExampleContextWithStep() {
	// The provider charges once per key, and answers a key it knows with
	// the charge it made.
	requests, charges := 0, map[string]bool{}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		charges[r.Header.Get(hdrKey)] = true
		w.WriteHeader(http.StatusCreated)
	}))
	defer provider.Close()
	client, err := idempotency.NewClient(idempotency.WithHTTPClient(provider.Client()))
	if err != nil {
		fmt.Println(err)
		return
	}

	handle := func(ctx context.Context) {
		// Two calls to one endpoint: each step its own key.
		for _, step := range []string{"charge-deposit", "charge-balance"} {
			req, err := http.NewRequestWithContext(idempotency.ContextWithStep(ctx, step),
				http.MethodPost, provider.URL+"/charges", strings.NewReader(`{"amount":50}`))
			if err != nil {
				fmt.Println(err)
				return
			}
			resp, err := client.Do(req)
			if err != nil {
				fmt.Println(err)
				return
			}
			resp.Body.Close()
		}
	}
	// The middleware puts the request's key, in its scope, in the
	// handler's context; here it is put there by hand, for two runs.
	for range 2 {
		handle(incoming.NewContext(context.Background(), &incoming.Key{Scope: "tenant-7", Key: "order-42"}))
	}

	fmt.Println("requests:", requests, "charges:", len(charges))
	// Output:
	// requests: 4 charges: 2
}

// The derived key, for an SDK that takes a key of its own (here, what
// stripe-go's Params.IdempotencyKey would be given). It is the same in
// every process and every run of the handler, and in every version of this
// package: changing how keys are derived would make a handler's retry after
// an upgrade send new keys.
func ExampleClient_DerivedKey() {
	ctx := incoming.NewContext(context.Background(), &incoming.Key{Scope: "tenant-7", Key: "order-42"})
	var client idempotency.Client // the zero Client derives without a secret
	key, ok := client.DerivedKey(ctx, "charge")
	fmt.Println(key, ok)
	// Output:
	// 74222cf6-ee01-8d99-a7f9-b4f2ebb7aa29 true
}

// A handler whose incoming keys are order numbers, which a downstream
// service could guess from a derived key: the Client derives keys with a
// secret, shared by every instance of the service.
func ExampleWithDerivedKeySecret() {
	secret := []byte("32 bytes of the service's secret") // from the service's secret store
	client, err := idempotency.NewClient(idempotency.WithDerivedKeySecret(secret))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := incoming.NewContext(context.Background(), &incoming.Key{Scope: "tenant-7", Key: "order-42"})
	key, ok := client.DerivedKey(ctx, "charge")
	fmt.Println(key, ok)
}
