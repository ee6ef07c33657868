package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency"
)

// An order endpoint that is unavailable at the first attempt.
func ExampleClient_Do() {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":"o-1"}`)
	}))
	defer srv.Close()

	c, err := idempotency.NewClient(idempotency.WithHTTPClient(srv.Client()))
	if err != nil {
		fmt.Println(err)
		return
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/orders",
		strings.NewReader(`{"amount":10}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	o, _ := idempotency.OutcomeOf(resp)
	fmt.Println(resp.Status, string(body))
	fmt.Println("attempts:", o.Attempts, "key sent:", o.Key != "")
	// Output:
	// 201 Created {"order":"o-1"}
	// attempts: 2 key sent: true
}

// An operation whose key is stored with it, so that a retry after a restart
// of the process sends the same key; the server answers it with the stored
// response.
func ExampleOutcomeOf() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(hdrKey) == "order-2026-0042" {
			w.Header().Set(hdrReplayed, "true")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	c, err := idempotency.NewClient(idempotency.WithHTTPClient(srv.Client()))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := idempotency.ContextWithKey(context.Background(), "order-2026-0042")
	resp, err := c.Post(ctx, srv.URL+"/orders", "application/json", strings.NewReader(`{"amount":10}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	o, ok := idempotency.OutcomeOf(resp)
	fmt.Println(ok, o.Key, o.Attempts, o.Replayed)
	// Output:
	// true order-2026-0042 1 true
}

// A Client behind an API client that takes an *http.Client.
func ExampleClient_StandardClient() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, len(r.Header.Get(hdrKey)))
	}))
	defer srv.Close()

	c, err := idempotency.NewClient(
		idempotency.WithHTTPClient(srv.Client()),
		idempotency.WithMaxAttempts(5),
		idempotency.WithAttemptTimeout(10*time.Second),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	hc := c.StandardClient()
	resp, err := hc.Post(srv.URL, "text/plain", strings.NewReader("hello"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println("key length:", string(body))
	// Output:
	// key length: 36
}

// An observer that prints what followed each attempt: a 503, retried, then
// the order created.
func ExampleWithObserver() {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	c, err := idempotency.NewClient(
		idempotency.WithHTTPClient(srv.Client()),
		idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
			fmt.Println(e.Attempt, e.Kind, e.StatusCode, "budget", e.Budget)
		}),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := c.Post(context.Background(), srv.URL+"/orders", "application/json", strings.NewReader(`{"amount":10}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	o, _ := idempotency.OutcomeOf(resp)
	fmt.Println("outcome:", o.Kind)
	// Output:
	// 1 retried 503 budget 495
	// 2 completed 201 budget 500
	// outcome: completed
}

// NewClient checks every option and names each invalid one, so that one run
// shows every mistake.
func ExampleNewClient_invalidOptions() {
	_, err := idempotency.NewClient(
		idempotency.WithMaxAttempts(0),
		nil,
		idempotency.WithDialect(nil),
		idempotency.WithMethods("post", ""),
	)
	fmt.Println(err)
	// Output:
	// idempotency: max attempts 0 is below 1
	// idempotency: option 1 is nil
	// idempotency: WithDialect needs a function
	// idempotency: WithMethods needs method names, not an empty one
}

// An API with a dialect of its own: the key in X-Request-Key, as the IETF
// draft's quoted string, and a replay said with X-Replayed: yes. Requests
// to other hosts keep this module's own dialect.
func ExampleWithDialect() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("key sent quoted:", strings.HasPrefix(r.Header.Get("X-Request-Key"), `"`))
		w.Header().Set("X-Replayed", "yes")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	client, err := idempotency.NewClient(
		idempotency.WithHTTPClient(srv.Client()),
		idempotency.WithDialect(func(req *http.Request) idempotency.Dialect {
			if req.URL.Host != strings.TrimPrefix(srv.URL, "http://") {
				return idempotency.Dialect{}
			}
			return idempotency.Dialect{
				Header: "X-Request-Key",
				Key:    func(key string) (string, error) { return strconv.Quote(key), nil },
				Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
					if resp.Header.Get("X-Replayed") == "yes" {
						return idempotency.EventReplayed, 0, nil
					}
					return 0, 0, nil
				},
			}
		}))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := client.Post(context.Background(), srv.URL+"/orders", "application/json", strings.NewReader(`{}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	out, _ := idempotency.OutcomeOf(resp)
	fmt.Println("replayed:", out.Replayed)
	// Output:
	// key sent quoted: true
	// replayed: true
}
