// Command servemux protects the orders endpoint of a net/http ServeMux, with
// Go 1.22 method and path patterns, by the idempotency middleware of package
// server.
//
// All of the API but its routing is in app.go, the same in every router
// example (so that each can be copied out on its own); its comment says why
// the idempotency records are kept per account. Here authenticate wraps the
// whole mux, so it runs first, for every route, and puts the caller's account
// in the request's context, where the middleware's scope function, scope
// (given with server.WithScope), finds it.
//
// The middleware wraps only the POST route: it passes other methods through
// untouched anyway, and wrapping per route keeps the rest of the mux out of
// its way. Path values (r.PathValue) survive it, since it changes only the
// request's context and body.
//
// # Try it
//
//	go run ./examples/servemux -addr 127.0.0.1:8080
//
//	curl -i http://127.0.0.1:8080/orders -H 'X-API-Key: alice-key-1' \
//		-H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' \
//		-d '{"item":"book","quantity":1}'
//
// The same command again answers with the same order and the header
// Idempotent-Replayed: true; with X-API-Key: bob-key it creates Bob's own
// order; without the Idempotency-Key header it is refused with 400; with the
// same key and another body it is refused with 422. GET /orders/{id} shows an
// order to its account.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	flag.Parse()
	if err := run(*addr, newHandler); err != nil {
		log.Fatal(err)
	}
}

// newHandler wires the API: authentication for every route, the idempotency
// middleware for the route that creates orders.
func newHandler(store engine.Store, book *book, accounts map[string]string) (http.Handler, error) {
	mw, err := server.New(store, server.WithScope(scope))
	if err != nil {
		return nil, err
	}
	api := &api{book: book}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(api.createOrder)))
	mux.HandleFunc("GET /orders/{id}", api.getOrder)
	return authenticate(accounts)(mux), nil
}

type api struct{ book *book }

func (a *api) createOrder(w http.ResponseWriter, r *http.Request) {
	account, _ := accountFrom(r.Context())
	req, err := decodeOrder(r.Body)
	if err != nil {
		// A 4xx is stored like a success: the same request would fail
		// the same way again.
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want an item and a positive quantity"})
		return
	}
	o := a.book.add(account, req.Item, req.Quantity)
	w.Header().Set("Location", "/orders/"+o.ID)
	writeJSON(w, http.StatusCreated, o)
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	account, _ := accountFrom(r.Context())
	o, ok := a.book.get(account, r.PathValue("id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such order"})
		return
	}
	writeJSON(w, http.StatusOK, o)
}
