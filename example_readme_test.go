package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// The client's POST and the middleware around a handler, as README.md
// shows them: the second call is the same operation (its key), so the
// middleware answers it from the store and the handler does not run again.
func Example_clientAndServer() {
	// The server: an orders API behind the middleware, on the embedded store.
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	var orders atomic.Int64
	api := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := orders.Add(1) // the effect: once per key
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, n)
	})))
	defer api.Close()

	// The client: one key per operation, made before the first attempt and
	// sent on every retry.
	client, err := idempotency.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	post := func(ctx context.Context) idempotency.Outcome {
		resp, err := client.Post(ctx, api.URL+"/orders", "application/json", strings.NewReader(`{"sku":"A1"}`))
		if err != nil {
			log.Fatal(err) // no response after every attempt: a *idempotency.RetryError
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		out, _ := idempotency.OutcomeOf(resp)
		fmt.Println(resp.StatusCode, string(body), "replayed:", out.Replayed)
		return out
	}
	first := post(context.Background())
	// The same operation again (a retry after a restart: its key was kept).
	post(idempotency.ContextWithKey(context.Background(), first.Key))
	fmt.Println("orders created:", orders.Load())
	// Output:
	// 201 {"order":1} replayed: false
	// 201 {"order":1} replayed: true
	// orders created: 1
}
