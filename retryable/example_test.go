package retryable_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency/retryable"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// An order service behind the middleware, whose first response is lost
// after the order was made. The protected go-retryablehttp client retries
// with the key it sent the first time, and the service replays the order
// instead of making a second one.
func ExampleProtect() {
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	var orders, requests atomic.Int64
	service := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders.Add(1))
	}))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			// The order is made, and its response lost on the way back.
			service.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
			return
		}
		service.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	defer srv.Close()

	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.RetryWaitMin, rc.RetryWaitMax = 10*time.Millisecond, 100*time.Millisecond
	if err := retryable.Protect(rc); err != nil {
		fmt.Println(err)
		return
	}
	resp, err := rc.Post(srv.URL+"/orders", "application/json", []byte(`{"item":"book"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed"))
	fmt.Println("requests:", requests.Load(), "orders:", orders.Load())
	// Output:
	// 201 Created order 1 replayed: true
	// requests: 2 orders: 1
}
