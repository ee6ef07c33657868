package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
)

// The life of one record, by hand: what the middleware of package server does
// with a Store for each request. Most programs only pass the Store to
// server.New.
func Example() {
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	ctx := context.Background()
	id := server.ID{Scope: "account:acct_42", Key: "order-7"}
	const lease, ttl = 30 * time.Second, 24 * time.Hour

	// The first request claims the key and runs.
	first, err := store.Claim(ctx, id, "fingerprint of the request", lease, ttl)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first:", first.Status)

	// A retry that arrives while it runs finds it in flight.
	during, _ := store.Claim(ctx, id, "fingerprint of the request", lease, ttl)
	fmt.Println("during:", during.Status)

	// The first request completes with its response, under its token.
	resp := &server.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"order":7}`),
	}
	if err := store.Complete(ctx, id, first.Token, resp, ttl); err != nil {
		fmt.Println(err)
		return
	}

	// A retry after that gets the stored response to replay.
	after, _ := store.Claim(ctx, id, "fingerprint of the request", lease, ttl)
	fmt.Println("after:", after.Status, after.Response.Status, string(after.Response.Body))
	fmt.Println("records:", store.Len())
	// Output:
	// first: acquired
	// during: in flight
	// after: completed 201 {"order":7}
	// records: 1
}

// A store bounded to a number of records refuses a new key when it is full of
// live ones, rather than forget a request that ran: the middleware then
// answers 503 and runs nothing.
func ExampleWithMaxRecords() {
	store, err := memstore.New(
		memstore.WithMaxRecords(2),
		memstore.WithMaxBytes(64<<20),
		memstore.WithSweepInterval(30*time.Second),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		_, err := store.Claim(ctx, server.ID{Key: key}, "fp", time.Minute, time.Hour)
		fmt.Printf("%s: full=%v\n", key, errors.Is(err, memstore.ErrFull))
	}
	// Output:
	// a: full=false
	// b: full=false
	// c: full=true
}

// A store at its byte bound keeps the record, so the request still never runs
// twice, but drops the response body: the replay says it was omitted.
func ExampleWithMaxBytes() {
	store, err := memstore.New(memstore.WithMaxBytes(1 << 10))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	ctx := context.Background()
	id := server.ID{Key: "report-1"}
	c, err := store.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil {
		fmt.Println(err)
		return
	}
	big := &server.Response{Status: http.StatusOK, Body: make([]byte, 4<<10)}
	if err := store.Complete(ctx, id, c.Token, big, time.Hour); err != nil {
		fmt.Println(err)
		return
	}
	replay, _ := store.Claim(ctx, id, "fp", time.Minute, time.Hour)
	fmt.Println(replay.Status, replay.Response.Status, len(replay.Response.Body), replay.Response.BodyOmitted)
	// Output:
	// completed 200 0 true
}
