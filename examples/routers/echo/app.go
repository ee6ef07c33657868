package main

// The orders API, all of it but the router: the demo accounts and their
// authentication, the idempotency middleware's scope function, the orders,
// and serving until Ctrl-C. Each router example has its own copy of this
// file, so that it can be copied out and run on its own.
//
// Who a key belongs to: the idempotency middleware keeps a record per
// (scope, key), and its scope function names the caller. This API
// authenticates callers by the X-API-Key header, so the default scope (a hash
// of the Authorization header) would put every caller in one empty scope.
// Instead the application's authentication runs first and puts the account
// in the request's context, and scope, given to server.WithScope, reads it there: two accounts
// that send the same key never share a record, and the two API keys of one
// account do.

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
)

// demoAccounts returns the demo accounts, by API key: alice-key-1 and
// alice-key-2 for acct_alice, bob-key for acct_bob. A real API looks up a
// hash of the key in its database.
func demoAccounts() map[string]string {
	return map[string]string{
		"alice-key-1": "acct_alice",
		"alice-key-2": "acct_alice",
		"bob-key":     "acct_bob",
	}
}

// accountKey is the request-context key of the authenticated account ID.
type accountKey struct{}

func withAccount(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, accountKey{}, id)
}

func accountFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(accountKey{}).(string)
	return id, ok
}

var errNoAccount = errors.New("no authenticated account in the request context")

// scope is the idempotency middleware's scope function: records belong to
// the authenticated account. Without one it fails, so that the middleware
// refuses the request with 400 rather than put it in a scope shared by all.
func scope(r *http.Request) (string, error) {
	account, ok := accountFrom(r.Context())
	if !ok {
		return "", errNoAccount
	}
	return "account:" + account, nil
}

// order is an order as the API answers it.
type order struct {
	ID       string `json:"id"`
	Account  string `json:"account"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// book holds the orders: the side effect that must happen once per key. A
// real API keeps them in its database.
type book struct {
	mu     sync.Mutex
	orders []order
}

func (b *book) add(account, item string, quantity int) order {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := order{ID: "ord_" + strconv.Itoa(len(b.orders)+1), Account: account, Item: item, Quantity: quantity}
	b.orders = append(b.orders, o)
	return o
}

func (b *book) get(account, id string) (order, bool) {
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
func (b *book) count(account string) int {
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

// orderRequest is the JSON body of POST /orders.
type orderRequest struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

var errInvalidOrder = errors.New("want an item and a positive quantity")

func (req orderRequest) validate() error {
	if req.Item == "" || req.Quantity < 1 {
		return errInvalidOrder
	}
	return nil
}

// run serves the API that newHandler makes, on an in-memory store, until
// SIGINT (Ctrl-C) or SIGTERM; then it shuts down, waiting up to 10 seconds
// for the requests in flight.
func run(addr string, newHandler func(store engine.Store, b *book, accounts map[string]string) (http.Handler, error)) error {
	store, err := memstore.New()
	if err != nil {
		return err
	}
	defer store.Close()
	h, err := newHandler(store, &book{}, demoAccounts())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Printf("orders API on http://%s (Ctrl-C stops it)", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	<-errc // http.ErrServerClosed, at once
	return err
}
