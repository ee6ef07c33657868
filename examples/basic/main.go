// Command basic shows the client's retry with an idempotency key against a
// local order endpoint that loses its first response: the order is created
// once, the connection is then dropped, and the client's retry, with the
// same key, gets the stored response back.
//
//	go run ./examples/basic
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	orders := &orderServer{stored: make(map[string]string)}
	srv := httptest.NewServer(orders)
	defer srv.Close()

	c := idempotency.NewClient(idempotency.WithHTTPClient(srv.Client()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := c.Post(ctx, srv.URL+"/orders", "application/json", strings.NewReader(`{"amount":10}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	o, _ := idempotency.OutcomeOf(resp)

	fmt.Println("status:  ", resp.Status, string(body))
	fmt.Println("key:     ", o.Key)
	fmt.Println("attempts:", o.Attempts)
	fmt.Println("replayed:", o.Replayed)
	fmt.Println("orders created by the server:", orders.created())
	return nil
}

// orderServer creates an order once per key and replays its response for
// the same key. It loses the response to the first request it handles.
type orderServer struct {
	mu       sync.Mutex
	stored   map[string]string
	requests int
}

func (s *orderServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idempotency.HeaderKey)
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.requests++
	first := s.requests == 1
	body, replayed := s.stored[key]
	if !replayed {
		body = fmt.Sprintf(`{"order":"o-%d"}`, len(s.stored)+1)
		s.stored[key] = body
	}
	s.mu.Unlock()

	fmt.Printf("server:   %s %s, key %s, replayed %v\n", r.Method, r.URL.Path, key, replayed)
	if first {
		// The order exists now, but the client never hears of it.
		fmt.Println("server:   dropping the connection before answering")
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	if replayed {
		w.Header().Set(idempotency.HeaderReplayed, "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, body)
}

func (s *orderServer) created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stored)
}
