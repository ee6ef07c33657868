package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/redisstore"
)

// createOrder stands for the application's handler.
func createOrder(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusCreated)
}

// What a program that starts does: Open checks that Redis will not evict the
// records, and, strict, refuses to start on one that may. It needs a Redis,
// so it is compiled, not run.
func ExampleOpen_standalone() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.Open(ctx, client, redisstore.WithStrictEviction())
	if err != nil {
		log.Fatal(err) // an evicting Redis, or one that cannot be read
	}
	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	defer mw.Shutdown(ctx)
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))
	if err := http.ListenAndServe(":8080", mux); err != nil {
		log.Print(err)
	}
}

// A Store on a standalone Redis. The client is the caller's: close it when
// done with the Store.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{
		Addr: "127.0.0.1:6379",
		// Let a request's deadline bound a call to a Redis that hangs.
		ContextTimeoutEnabled: true,
	})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.WithPrefix("orders-api:idempotency:"))
	if err != nil {
		log.Fatal(err)
	}

	// What the middleware does with it, by hand.
	ctx := context.Background()
	id := engine.ID{Scope: "tenant-42", Key: "9f6c1a4e-order-7"}
	claim, err := store.Claim(ctx, id, "sha256 of the request", 30*time.Second, 24*time.Hour)
	if err != nil {
		log.Fatal(err) // Redis unreachable: answer 503, run nothing
	}
	switch claim.Status {
	case engine.Acquired:
		resp := &engine.Response{Status: http.StatusCreated, Body: []byte(`{"order":7}`)}
		if err := store.Complete(ctx, id, claim.Token, resp, 24*time.Hour); err != nil {
			log.Print(err)
		}
	case engine.InFlight:
		fmt.Println("in flight; retry after", claim.RetryAfter)
	case engine.Completed:
		fmt.Println("replay", claim.Response.Status)
	}
}

// A Store on a Redis Cluster: every operation touches one key, so it runs on
// the node that owns it.
func ExampleNew_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	store, err := redisstore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	_ = store // pass it to server.New
}

// RecordKey names the key an operator inspects or deletes. New does no I/O,
// so this runs without a server.
func ExampleStore_RecordKey() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.RecordKey(engine.ID{Scope: "tenant-42", Key: "order-7"}))
	fmt.Println(store.RecordKey(engine.ID{Scope: "a:b", Key: "c"}))
	fmt.Println(store.RecordKey(engine.ID{Scope: "a", Key: "b:c"}))
	// Output:
	// idempotency:9:tenant-42:order-7
	// idempotency:3:a:b:c
	// idempotency:1:a:b:c
}

// Open checks, as the process starts, that Redis will not evict the
// records; strict, it refuses to start on a Redis that may. A Sentinel
// client with the replica acknowledgement: a claim is answered only once a
// replica has it.
func ExampleOpen() {
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            "orders",
		SentinelAddrs:         []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		ContextTimeoutEnabled: true,
		// Fail fast on a Redis that is down: one dial, no command retry
		// (the middleware answers 503 and the client retries).
		DialTimeout:   time.Second,
		DialerRetries: 1,
		MaxRetries:    -1,
	})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	store, err := redisstore.Open(ctx, client,
		redisstore.WithStrictEviction(),
		redisstore.WithReplicaAck(1, 500*time.Millisecond))
	if err != nil {
		log.Fatal(err) // an evicting Redis, or one that cannot be read
	}
	_ = store // pass it to server.New; run store.Check from the health check
}

// An operator looks a key up and settles it: here, a request whose holder
// was lost after its effect, which the operator found done downstream.
func ExampleStore_Resolve() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store, err := redisstore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	id := engine.ID{Scope: "tenant-42", Key: "order-7"}
	rec, err := store.Lookup(ctx, id)
	if errors.Is(err, engine.ErrNotFound) {
		fmt.Println("no record: the next request runs")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("completed %v, %d holders abandoned it, first claimed %v\n", rec.Completed, rec.Abandoned, rec.Created)
	if !rec.Completed {
		done := &engine.Response{Status: http.StatusCreated, Body: []byte(`{"order":7}`)}
		if err := store.Resolve(ctx, id, done, 24*time.Hour); err != nil {
			log.Fatal(err)
		}
	}
}

// Options that cannot work are refused by New, all named in one error.
func ExampleWithReplicaAck() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	_, err := redisstore.New(client, redisstore.WithReplicaAck(0, 0))
	fmt.Println(err)
	// Output:
	// redisstore: WithReplicaAck(0, 0s): want at least 1 replica and a timeout above 0
}
