package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/redisstore"
)

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
	id := server.ID{Scope: "tenant-42", Key: "9f6c1a4e-order-7"}
	claim, err := store.Claim(ctx, id, "sha256 of the request", 30*time.Second, 24*time.Hour)
	if err != nil {
		log.Fatal(err) // Redis unreachable: answer 503, run nothing
	}
	switch claim.Status {
	case server.Acquired:
		resp := &server.Response{Status: http.StatusCreated, Body: []byte(`{"order":7}`)}
		if err := store.Complete(ctx, id, claim.Token, resp, 24*time.Hour); err != nil {
			log.Print(err)
		}
	case server.InFlight:
		fmt.Println("in flight; retry after", claim.RetryAfter)
	case server.Completed:
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
	fmt.Println(store.RecordKey(server.ID{Scope: "tenant-42", Key: "order-7"}))
	fmt.Println(store.RecordKey(server.ID{Scope: "a:b", Key: "c"}))
	fmt.Println(store.RecordKey(server.ID{Scope: "a", Key: "b:c"}))
	// Output:
	// idempotency:9:tenant-42:order-7
	// idempotency:3:a:b:c
	// idempotency:1:a:b:c
}
