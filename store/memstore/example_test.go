package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
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
	id := engine.ID{Scope: "account:acct_42", Key: "order-7"}
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
	resp := &engine.Response{
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
		_, err := store.Claim(ctx, engine.ID{Key: key}, "fp", time.Minute, time.Hour)
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
	id := engine.ID{Key: "report-1"}
	c, err := store.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil {
		fmt.Println(err)
		return
	}
	big := &engine.Response{Status: http.StatusOK, Body: make([]byte, 4<<10)}
	if err := store.Complete(ctx, id, c.Token, big, time.Hour); err != nil {
		fmt.Println(err)
		return
	}
	replay, _ := store.Claim(ctx, id, "fp", time.Minute, time.Hour)
	fmt.Println(replay.Status, replay.Response.Status, len(replay.Response.Body), replay.Response.BodyOmitted)
	// Output:
	// completed 200 0 true
}

// An operator settles a key whose first holder was lost: the retry that took
// it over saw Abandoned 1, and the operator, who knows the order was made,
// records it as done, so that every later retry gets the answer and nothing
// runs again. Resolve with a nil response would instead forget the key, so
// that the next retry runs it.
func ExampleStore_Resolve() {
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ctx := context.Background()
	id := engine.ID{Scope: "account:acct_42", Key: "order-8"}

	// The first holder's process dies: its lease, short here, runs out.
	first, _ := store.Claim(ctx, id, "fp", time.Nanosecond, time.Hour)
	fmt.Println("first:", first.Status, "abandoned before it:", first.Abandoned)
	var retry engine.Claim
	for retry.Status != engine.Acquired {
		retry, _ = store.Claim(ctx, id, "fp", time.Minute, time.Hour)
	}
	fmt.Println("retry:", retry.Status, "abandoned before it:", retry.Abandoned)

	rec, err := store.Lookup(ctx, id)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("lookup: completed", rec.Completed, "abandoned", rec.Abandoned, "lease ends after creation:", rec.LeaseEnds.After(rec.Created))

	done := &engine.Response{Status: http.StatusCreated, Body: []byte(`{"order":8}`)}
	if err := store.Resolve(ctx, id, done, 24*time.Hour); err != nil {
		fmt.Println(err)
		return
	}
	// The retry still running is fenced off; later retries get the answer.
	err = store.Complete(ctx, id, retry.Token, done, time.Hour)
	fmt.Println("retry's Complete refused:", errors.Is(err, engine.ErrLeaseLost))
	after, _ := store.Claim(ctx, id, "fp", time.Minute, time.Hour)
	fmt.Println("after:", after.Status, after.Response.Status, string(after.Response.Body))
	// Output:
	// first: acquired abandoned before it: 0
	// retry: acquired abandoned before it: 1
	// lookup: completed false abandoned 1 lease ends after creation: true
	// retry's Complete refused: true
	// after: completed 201 {"order":8}
}
