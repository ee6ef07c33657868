package once_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/memstore"
)

// A message delivered twice, as a broker redelivers one that was not
// acknowledged: the charge runs once, and the second delivery gets the
// stored result.
func Example() {
	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	r, err := once.New(store)
	if err != nil {
		panic(err)
	}
	defer r.Shutdown(context.Background())

	charges := 0
	charge := func(ctx context.Context) (string, error) {
		charges++
		return fmt.Sprintf("receipt-%d", charges), nil
	}
	msg := struct{ ID, Account, Body string }{"msg-42", "acct_7", `{"amount":1200}`}
	// The scope names whose key it is: here the account the charge is
	// for, as the application authenticated it, never a credential such
	// as a bearer token, which a retry may carry refreshed.
	id := engine.ID{Scope: "payments/" + msg.Account, Key: msg.ID}
	for delivery := 1; delivery <= 2; delivery++ {
		res, err := doResult(context.Background(), r, id, msg.Body, charge)
		if err != nil {
			panic(err)
		}
		fmt.Printf("delivery %d: %s (replayed: %v)\n", delivery, res.Value, res.Replayed)
	}
	fmt.Println("charges:", charges)

	// The same key with another body is refused.
	_, err = once.Do(context.Background(), r, id, `{"amount":9900}`, charge)
	fmt.Println(errors.Is(err, engine.ErrKeyMismatch))
	// Output:
	// delivery 1: receipt-1 (replayed: false)
	// delivery 2: receipt-1 (replayed: true)
	// charges: 1
	// true
}

// A permanent failure is stored like a 4xx: the retry gets it again, and
// the function does not run again. Any other error releases the key.
func ExamplePermanent() {
	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	r, err := once.New(store)
	if err != nil {
		panic(err)
	}
	defer r.Shutdown(context.Background())

	id := engine.ID{Scope: "payments", Key: "msg-7"}
	decline := func(ctx context.Context) (string, error) {
		return "", once.Permanent(errors.New("card declined"))
	}
	for range 2 {
		_, err := once.Do(context.Background(), r, id, nil, decline)
		fmt.Println(err, errors.Is(err, once.ErrPermanent))
	}
	// Output:
	// card declined true
	// card declined true
}
