// Command ours serves the same orders endpoint as the other harness
// servers behind this module's own middleware (package server, memory
// store, defaults), as a reference row for the compatibility table.
// Environment: PORT, DELAY_MS (how long creating an order takes, 100 by
// default).
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func main() {
	delay := 100 * time.Millisecond
	if ms, err := strconv.Atoi(os.Getenv("DELAY_MS")); err == nil {
		delay = time.Duration(ms) * time.Millisecond
	}
	var created atomic.Int64
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "induced failure", http.StatusInternalServerError)
			return
		}
		time.Sleep(delay) // the work of creating an order
		id := created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"order":%q}`, id, body)
	})
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(orders))
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), mux))
}
