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
// # Who the key belongs to
//
// Records are kept per caller: the middleware addresses each one by (scope,
// key), and the scope function names the caller. This API authenticates its
// callers by the X-API-Key header, so the default scope, a hash of the
// Authorization header, would put every caller in one empty scope, where one
// account could be served another's order. Instead authenticate, the
// application's own middleware, runs first (r.Use, before the routes), puts
// the caller's account ID in the request's context, and the scope function
// given with server.WithScope, scopeByAccount, reads it there. Two accounts
// that send the same key never share a record; the two API keys of one
// account do, so a retry made with a rotated key is still a retry.
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
	"context"
	"encoding/json"
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

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

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
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Use(authenticate(accounts))
	r.Route("/orders", func(r chi.Router) {
		r.With(mw.Handler).Post("/", api.createOrder)
		r.Get("/{id}", api.getOrder)
	})
	return r, nil
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
func authenticate(accounts map[string]string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			account, ok := accounts[r.Header.Get("X-API-Key")]
			if !ok {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "unknown or missing X-API-Key"})
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
		})
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

func (a *api) createOrder(w http.ResponseWriter, r *http.Request) {
	account, _ := accountFrom(r.Context())
	var req orderRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Item == "" || req.Quantity < 1 {
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
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
