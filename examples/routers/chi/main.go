// Command chi protects the orders endpoint of a chi router by the idempotency
// middleware of package server.
//
// chi's middleware is net/http middleware, so (*server.Middleware).Handler
// plugs in as it is: r.With(mw.Handler) protects one route, r.Use(mw.Handler)
// every route of a router (the middleware touches only POST and PATCH
// requests). chi keeps its URL parameters in the request's context, and the
// middleware gives the handler a context derived from the request's, so
// chi.URLParam works behind it.
//
// All of the API but its routing is in app.go, the same in every router
// example (so that each can be copied out on its own); its comment says why
// the idempotency records are kept per account. Here authenticate, net/http
// middleware too, runs first (r.Use, before the routes) and puts the caller's
// account in the request's context, where the middleware's scope function,
// scope (given with server.WithScope), finds it.
//
// middleware.Recoverer comes first of all: the idempotency middleware
// releases the key of a handler that panics and lets the panic go on, for the
// recoverer to answer 500.
//
// # Try it
//
//	cd examples/routers && go run ./chi -addr 127.0.0.1:8080
//
//	curl -i http://127.0.0.1:8080/orders -H 'X-API-Key: alice-key-1' \
//		-H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' \
//		-d '{"item":"book","quantity":1}'
//
// The same command again answers with the same order and the header
// Idempotent-Replayed: true; with X-API-Key: bob-key it creates Bob's own
// order; without the Idempotency-Key header it is refused with 400; with the
// same key and another body it is refused with 422.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

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

// newHandler wires the API: recovery and authentication for every route, the
// idempotency middleware for the route that creates orders.
func newHandler(store engine.Store, book *book, accounts map[string]string) (http.Handler, error) {
	mw, err := server.New(store, server.WithScope(scope))
	if err != nil {
		return nil, err
	}
	api := &api{book: book}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Use(authenticate(accounts))
	r.Route("/orders", func(r chi.Router) {
		r.With(mw.Handler).Post("/", api.createOrder)
		r.Get("/{id}", api.getOrder)
	})
	return r, nil
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
	o, ok := a.book.get(account, chi.URLParam(r, "id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such order"})
		return
	}
	writeJSON(w, http.StatusOK, o)
}
