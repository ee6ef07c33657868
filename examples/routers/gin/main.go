// Command gin protects the orders endpoint of a gin engine by the idempotency
// middleware of package server.
//
// gin's handlers are not net/http handlers, so the middleware goes in
// through a small adapter, idempotent (in idempotent.go): a gin.HandlerFunc
// that runs the rest of the chain (c.Next) inside the middleware, with
// c.Request and c.Writer set to the request and writer the middleware hands
// on. The middleware must see every byte the handlers write, so that it can
// store the response before the client sees it; an adapter that left
// c.Writer alone would let the first response through and store an empty
// one for the retries. The doc of idempotent says the rest.
//
// # Who the key belongs to
//
// All of the API but its routing is in app.go, the same in every router
// example (so that each can be copied out on its own); its comment says why
// the idempotency records are kept per account. Here authenticate, the
// application's own gin middleware, runs first and puts the caller's account
// ID in the context of the request, c.Request.Context(), where the
// middleware's scope function, scope (given with server.WithScope), finds it.
// Not with c.Set: the scope function receives the *http.Request, not the
// *gin.Context, so it never sees gin's keys.
//
// gin.Recovery comes first of all: the idempotency middleware releases the
// key of a handler that panics and lets the panic go on, for gin to answer
// 500.
//
// # Try it
//
//	cd examples/routers && go run ./gin -addr 127.0.0.1:8080
//
//	curl -i http://127.0.0.1:8080/orders -H 'X-API-Key: alice-key-1' \
//		-H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' \
//		-d '{"item":"book","quantity":1}'
//
// The same command again answers with the same order and the header
// Idempotent-Replayed: true; with X-API-Key: bob-key it creates Bob's own
// order; without the Idempotency-Key header it is refused with 400; with the
// same key and another body it is refused with 422. GIN_MODE=release
// silences gin's debug output.
package main

import (
	"flag"
	"log"
	"net/http"

	"github.com/gin-gonic/gin"

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
	r := gin.New()
	r.Use(gin.Recovery(), authenticate(accounts))
	r.POST("/orders", idempotent(mw), api.createOrder)
	r.GET("/orders/:id", api.getOrder)
	return r, nil
}

// authenticate is the application's authentication, as gin middleware: it
// answers 401 to an unknown API key, and passes the caller's account on in
// the request's context, where handlers and the scope function find it.
func authenticate(accounts map[string]string) gin.HandlerFunc {
	return func(c *gin.Context) {
		account, ok := accounts[c.GetHeader("X-API-Key")]
		if !ok {
			c.AbortWithStatusJSON(http.StatusUnauthorized, gin.H{"error": "unknown or missing X-API-Key"})
			return
		}
		c.Request = c.Request.WithContext(withAccount(c.Request.Context(), account))
		c.Next()
	}
}

type api struct{ book *book }

func (a *api) createOrder(c *gin.Context) {
	account, _ := accountFrom(c.Request.Context())
	var req orderRequest
	if err := c.ShouldBindJSON(&req); err != nil || req.validate() != nil {
		// A 4xx is stored like a success: the same request would fail
		// the same way again.
		c.JSON(http.StatusBadRequest, gin.H{"error": "want an item and a positive quantity"})
		return
	}
	o := a.book.add(account, req.Item, req.Quantity)
	c.Header("Location", "/orders/"+o.ID)
	c.JSON(http.StatusCreated, o)
}

func (a *api) getOrder(c *gin.Context) {
	account, _ := accountFrom(c.Request.Context())
	o, ok := a.book.get(account, c.Param("id"))
	if !ok {
		c.JSON(http.StatusNotFound, gin.H{"error": "no such order"})
		return
	}
	c.JSON(http.StatusOK, o)
}
