// Command echo protects the orders endpoint of an echo (v4) server by the
// idempotency middleware of package server.
//
// echo adapts net/http middleware with echo.WrapMiddleware, which runs the
// rest of the chain inside the middleware with the middleware's request and
// writer, so the middleware sees every byte the handler writes and can store
// the response before the client sees it. The adapter here, idempotent (in
// idempotent.go), adds what WrapMiddleware lacks for this middleware: an
// error that the handler returns is rendered inside the middleware, where it
// is stored like any response, instead of after it, where it would be lost;
// and the response is put back for the middleware before it, so that
// middleware.Recover answers a panic with 500. The doc of idempotent says
// more.
//
// # Who the key belongs to
//
// All of the API but its routing is in app.go, the same in every router
// example (so that each can be copied out on its own); its comment says why
// the idempotency records are kept per account. Here authenticate, the
// application's own echo middleware, runs first and puts the caller's account
// ID in the context of the request, c.Request().Context(), where the
// middleware's scope function, scope (given with server.WithScope), finds it.
// Not with c.Set: the scope function receives the *http.Request, not the
// echo.Context, so it never sees echo's values.
//
// # Try it
//
//	cd examples/routers && go run ./echo -addr 127.0.0.1:8080
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

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

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
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.Recover(), authenticate(accounts))
	e.POST("/orders", api.createOrder, idempotent(mw))
	e.GET("/orders/:id", api.getOrder)
	return e, nil
}

// authenticate is the application's authentication, as echo middleware: it
// answers 401 to an unknown API key, and passes the caller's account on in
// the request's context, where handlers and the scope function find it.
func authenticate(accounts map[string]string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			account, ok := accounts[r.Header.Get("X-API-Key")]
			if !ok {
				return echo.NewHTTPError(http.StatusUnauthorized, "unknown or missing X-API-Key")
			}
			c.SetRequest(r.WithContext(withAccount(r.Context(), account)))
			return next(c)
		}
	}
}

type api struct{ book *book }

func (a *api) createOrder(c echo.Context) error {
	account, _ := accountFrom(c.Request().Context())
	var req orderRequest
	if err := c.Bind(&req); err != nil || req.validate() != nil {
		// A 4xx is stored like a success: the same request would fail
		// the same way again.
		return echo.NewHTTPError(http.StatusBadRequest, "want an item and a positive quantity")
	}
	o := a.book.add(account, req.Item, req.Quantity)
	c.Response().Header().Set(echo.HeaderLocation, "/orders/"+o.ID)
	return c.JSON(http.StatusCreated, o)
}

func (a *api) getOrder(c echo.Context) error {
	account, _ := accountFrom(c.Request().Context())
	o, ok := a.book.get(account, c.Param("id"))
	if !ok {
		return echo.NewHTTPError(http.StatusNotFound, "no such order")
	}
	return c.JSON(http.StatusOK, o)
}
