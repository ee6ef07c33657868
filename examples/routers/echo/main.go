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
// Records are kept per caller: the middleware addresses each one by (scope,
// key), and the scope function names the caller. This API authenticates its
// callers by the X-API-Key header, so the default scope, a hash of the
// Authorization header, would put every caller in one empty scope, where one
// account could be served another's order.
//
// Instead authenticate, the application's own echo middleware, runs first
// and puts the caller's account ID in the context of the request,
// c.Request().Context(), and the scope function given with
// server.WithScope, scopeByAccount, reads it there. Not with c.Set: the
// scope function receives the *http.Request, not the echo.Context, so it
// never sees echo's values. Two accounts that send the same key never share
// a record; the two API keys of one account do, so a retry made with a
// rotated key is still a retry.
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
	"context"
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	flag.Parse()
	if err := run(*addr); err != nil {
		log.Fatal(err)
	}
}

// demoAccounts maps API keys to accounts. A real API looks up a hash of the
// key in its database.
var demoAccounts = map[string]string{
	"alice-key-1": "acct_alice",
	"alice-key-2": "acct_alice",
	"bob-key":     "acct_bob",
}

func run(addr string) error {
	store := memstore.New()
	defer store.Close()
	h, err := newHandler(store, &orderBook{}, demoAccounts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Printf("orders API on http://%s (Ctrl-C stops it)", ln.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// newHandler wires the API: recovery and authentication for every route, the
// idempotency middleware for the route that creates orders.
func newHandler(store server.Store, book *orderBook, accounts map[string]string) (http.Handler, error) {
	mw, err := server.New(store, server.WithScope(scopeByAccount))
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

// accountKey is the request-context key of the authenticated account ID.
type accountKey struct{}

func accountFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(accountKey{}).(string)
	return id, ok
}

// authenticate is the application's authentication: it answers 401 to an
// unknown API key, and passes the caller's account on in the request's
// context, where handlers and the scope function find it.
func authenticate(accounts map[string]string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			account, ok := accounts[r.Header.Get("X-API-Key")]
			if !ok {
				return echo.NewHTTPError(http.StatusUnauthorized, "unknown or missing X-API-Key")
			}
			c.SetRequest(r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
			return next(c)
		}
	}
}

// scopeByAccount is the middleware's scope function: idempotency records
// belong to the authenticated account. Without one (a route protected but
// not authenticated) the request is refused with 400 rather than put in a
// scope shared by everyone.
func scopeByAccount(r *http.Request) (string, error) {
	account, ok := accountFrom(r.Context())
	if !ok {
		return "", errors.New("no authenticated account in the request context")
	}
	return "account:" + account, nil
}

type api struct{ book *orderBook }

type orderRequest struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

func (a *api) createOrder(c echo.Context) error {
	account, _ := accountFrom(c.Request().Context())
	var req orderRequest
	if err := c.Bind(&req); err != nil || req.Item == "" || req.Quantity < 1 {
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

type order struct {
	ID       string `json:"id"`
	Account  string `json:"account"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// orderBook holds the orders: the side effect that must happen once per
// key. A real API keeps them in its database.
type orderBook struct {
	mu     sync.Mutex
	orders []order
}

func (b *orderBook) add(account, item string, quantity int) order {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := order{ID: "ord_" + strconv.Itoa(len(b.orders)+1), Account: account, Item: item, Quantity: quantity}
	b.orders = append(b.orders, o)
	return o
}

func (b *orderBook) get(account, id string) (order, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.orders {
		if o.ID == id && o.Account == account {
			return o, true
		}
	}
	return order{}, false
}

// count returns how many orders account has.
func (b *orderBook) count(account string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, o := range b.orders {
		if o.Account == account {
			n++
		}
	}
	return n
}
