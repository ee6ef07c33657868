package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// An orders handler behind the middleware. The first request runs it; the
// same request again, with the same key, is answered from the store and
// marked as a replay; the same key for a different request is refused with
// 422. Keys belong to the principal the application authenticated (its
// scope), not to a credential, which a retry may carry refreshed.
func Example() {
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	type principalKey struct{}
	mw, err := server.New(store, server.WithScope(func(r *http.Request) (string, error) {
		account, ok := r.Context().Value(principalKey{}).(string)
		if !ok {
			return "", errors.New("unauthenticated")
		}
		return account, nil
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	// The application's authentication, reduced to one account: it puts
	// the caller's principal in the request's context, in front of the
	// middleware.
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, "acct_1")))
		})
	}

	var created atomic.Int64
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, created.Add(1))
	})
	srv := httptest.NewServer(authenticate(mw.Handler(createOrder)))
	defer srv.Close()

	post := func(key, body string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		if err != nil {
			fmt.Println(err)
			return
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			var p struct{ Title string }
			json.Unmarshal(b, &p)
			fmt.Printf("%s, problem: %s\n", resp.Status, p.Title)
			return
		}
		fmt.Printf("%s, replayed %q: %s\n", resp.Status, resp.Header.Get("Idempotent-Replayed"), b)
	}
	post("order-1", `{"sku":"A1"}`)
	post("order-1", `{"sku":"A1"}`)
	post("order-1", `{"sku":"B2"}`)
	fmt.Println("orders created:", created.Load())
	// Output:
	// 201 Created, replayed "": {"order":1}
	// 201 Created, replayed "true": {"order":1}
	// 422 Unprocessable Entity, problem: Idempotency key reused
	// orders created: 1
}

// Keys scoped by the application's own principal: its authentication
// middleware puts the caller's account in the request's context, before the
// idempotency middleware, and the scope function reads it there. Two accounts
// that send the same key each get their own order.
func ExampleWithScope() {
	// The application's authentication, reduced to a lookup.
	type accountKey struct{}
	accounts := map[string]string{"alice-key": "acct_alice", "bob-key": "acct_bob"}
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			account, ok := accounts[r.Header.Get("X-API-Key")]
			if !ok {
				http.Error(w, "unknown API key", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
		})
	}

	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	mw, err := server.New(store, server.WithScope(func(r *http.Request) (string, error) {
		account, ok := r.Context().Value(accountKey{}).(string)
		if !ok {
			return "", errors.New("no account in the request context")
		}
		return "account:" + account, nil
	}))
	if err != nil {
		fmt.Println(err)
		return
	}

	var created atomic.Int64
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %s", created.Add(1), r.Context().Value(accountKey{}))
	})
	srv := httptest.NewServer(authenticate(mw.Handler(createOrder)))
	defer srv.Close()

	for _, apiKey := range []string{"alice-key", "bob-key", "alice-key"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A1"}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		req.Header.Set("X-API-Key", apiKey)
		req.Header.Set("Idempotency-Key", "order-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s: %s (replayed %q)\n", apiKey, b, resp.Header.Get("Idempotent-Replayed"))
	}
	// Output:
	// alice-key: order 1 for acct_alice (replayed "")
	// bob-key: order 2 for acct_bob (replayed "")
	// alice-key: order 1 for acct_alice (replayed "true")
}

// A protected handler finds its lease in the request's context: the key and
// scope it runs for, and the fencing token to pass to a downstream system
// that should refuse writes from a holder whose lease was lost.
func Example_lease() {
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
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, ok := engine.LeaseFromContext(r.Context())
		if !ok {
			http.Error(w, "not protected", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "key %s, token issued: %v", lease.Key, lease.Token > 0)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	if err != nil {
		fmt.Println(err)
		return
	}
	req.Header.Set("Idempotency-Key", "payout-9")
	resp, err := srv.Client().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(string(b))
	// Output:
	// key payout-9, token issued: true
}

// The headers stored and replayed by default. To keep one more, add it to
// the list rather than name a list of your own, which would drop the others.
func ExampleDefaultStoredHeaders() {
	for _, name := range server.DefaultStoredHeaders() {
		fmt.Println(name)
	}
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	_, err = server.New(store, server.WithStoredHeaders(append(server.DefaultStoredHeaders(), "X-Request-Id")...))
	fmt.Println("with X-Request-Id too:", err == nil)
	// Output:
	// Allow
	// Cache-Control
	// Content-Digest
	// Content-Disposition
	// Content-Encoding
	// Content-Language
	// Content-Location
	// Content-Range
	// Content-Type
	// Digest
	// ETag
	// Expires
	// Last-Modified
	// Link
	// Location
	// Repr-Digest
	// Retry-After
	// Vary
	// WWW-Authenticate
	// with X-Request-Id too: true
}

// An API that publishes its key format (here, a UUID) enforces it: any other
// key is answered 400 with the key_invalid problem, and nothing runs.
func ExampleWithKeyFormat() {
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	isUUID := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	mw, err := server.New(store, server.WithKeyFormat(func(key string) error {
		if !isUUID.MatchString(key) {
			return errors.New("the key must be a lowercase UUID")
		}
		return nil
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	for _, key := range []string{"order-1", "7d444840-9dc0-11d1-b245-5ffdce74fad2"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		if err != nil {
			fmt.Println(err)
			return
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		var p struct{ Code, Detail string }
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, p.Code, p.Detail)
	}
	// Output:
	// 400 key_invalid The Idempotency-Key header is invalid: the key must be a lowercase UUID.
	// 201
}

// The package documentation's snippet, as it compiles: a handler function
// behind the middleware on a ServeMux, each caller in its own scope.
func Example_serveMux() {
	accountOf := func(r *http.Request) (string, error) {
		account := r.Header.Get("X-Account") // set by the application's authentication
		if account == "" {
			return "", errors.New("no account")
		}
		return account, nil
	}
	createOrder := func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, "order created")
	}

	store, err := memstore.New() // one process; pgstore or redisstore for several
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	mw, err := server.New(store, server.WithScope(accountOf))
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		if err != nil {
			fmt.Println(err)
			return
		}
		req.Header.Set("Idempotency-Key", "order-1")
		req.Header.Set("X-Account", "acct_alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
	}
	// Output:
	// 201 replayed="" order created
	// 201 replayed="true" order created
}
