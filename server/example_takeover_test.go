package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// takenOver stands for a store whose last holder of the key died after its
// effect: its first acquiring Claim reports one abandoned holder.
type takenOver struct {
	engine.Store
	once sync.Once
}

func (s *takenOver) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if err == nil && c.Status == engine.Acquired {
		s.once.Do(func() { c.Abandoned = 1 })
	}
	return c, err
}

// A handler that took a key over from an abandoned holder looks for its own
// effect before doing it again: the holder may have created the order and
// died before its response was stored.
func Example_takeover() {
	mem, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mem.Close()
	mw, err := server.New(&takenOver{Store: mem})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mw.Shutdown(context.Background())

	// The orders the application has made, by idempotency key: the lost
	// holder made order 7 for key order-123 before it died.
	var mu sync.Mutex
	orders := map[engine.ID]int{{Key: "order-123"}: 7}
	next := 8

	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease, _ := engine.LeaseFromContext(r.Context())
		mu.Lock()
		defer mu.Unlock()
		if lease.Abandoned > 0 {
			if n, ok := orders[lease.ID]; ok {
				fmt.Fprintf(w, "order %d (found, attempt %d)", n, lease.Abandoned+1)
				return
			}
		}
		orders[lease.ID] = next
		fmt.Fprintf(w, "order %d (created, attempt %d)", next, lease.Abandoned+1)
		next++
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	for _, key := range []string{"order-123", "order-124", "order-123"} {
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
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s: %s (replayed %q)\n", key, b, resp.Header.Get("Idempotent-Replayed"))
	}
	// Output:
	// order-123: order 7 (found, attempt 2) (replayed "")
	// order-124: order 8 (created, attempt 1) (replayed "")
	// order-123: order 7 (found, attempt 2) (replayed "true")
}

// With RefuseAbandoned, a retry that takes a key over from an abandoned
// holder does not run: it gets a final "outcome unknown" problem, recorded
// and replayed to every retry until an operator resolves the key.
func ExampleWithConfig() {
	mem, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mem.Close()
	mw, err := server.New(&takenOver{Store: mem}, server.WithConfig(engine.Config{Abandoned: engine.RefuseAbandoned}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mw.Shutdown(context.Background())
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("the handler ran")
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	for range 2 {
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
		resp.Body.Close()
		fmt.Printf("%d, outcome %q, Retry-After %q, replayed %q\n", resp.StatusCode,
			resp.Header.Get(engine.HeaderOutcome), resp.Header.Get("Retry-After"), resp.Header.Get("Idempotent-Replayed"))
	}
	c, err := mem.Claim(context.Background(), engine.ID{Key: "payout-9"}, "", time.Minute, time.Hour)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("recorded as unknown:", c.Response.OutcomeUnknown())
	// Output:
	// 409, outcome "unknown", Retry-After "", replayed ""
	// 409, outcome "unknown", Retry-After "", replayed "true"
	// recorded as unknown: true
}
