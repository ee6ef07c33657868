package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// orderService is the API under test: every execution creates an order with
// a new number, and is counted by the client's own reference for it.
type orderService struct {
	mu         sync.Mutex
	next       int
	executions map[string]int // by reference
}

func newOrderService() *orderService { return &orderService{executions: map[string]int{}} }

func (s *orderService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in struct{ Ref string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Ref == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.next++
	id := s.next
	s.executions[in.Ref]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"ref":%q}`, id, in.Ref)
}

// totals returns how many executions there were, and how many references
// ran more than once.
func (s *orderService) totals() (executions, duplicated int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.executions {
		executions += n
		if n > 1 {
			duplicated++
		}
	}
	return executions, duplicated
}

func startServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func startProxy(t *testing.T, upstream string, cfg faultnet.Config) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Start(upstream, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// lossy drops a fifth of the responses after the server handled the
// request, resets a twentieth of the connections before it saw them, and
// holds a twentieth past the client's attempt timeout.
var lossy = faultnet.Config{DropRate: 0.2, ResetRate: 0.05, DelayRate: 0.05, Delay: 2 * time.Second, Seed: 42}

const (
	orders  = 1000
	workers = 16
	// attemptTimeout is shorter than the proxy's delay, so a delayed
	// response is one the client has given up on.
	attemptTimeout = 500 * time.Millisecond
)

// submitAll submits orders references from workers goroutines, each order
// retried by submit until it succeeds, and returns the order IDs received.
func submitAll(t *testing.T, submit func(ref string) (id int, err error)) []int {
	t.Helper()
	refs := make(chan string)
	go func() {
		defer close(refs)
		for i := range orders {
			refs <- fmt.Sprintf("order-%04d", i)
		}
	}()
	var (
		mu  sync.Mutex
		ids []int
		wg  sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for ref := range refs {
				var (
					id  int
					err error
				)
				for try := 0; try < 20; try++ {
					if id, err = submit(ref); err == nil {
						break
					}
				}
				if err != nil {
					t.Errorf("order %s never succeeded: %v", ref, err)
					continue
				}
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids
}

func decodeOrder(resp *http.Response) (int, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	var out struct{ ID int }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, err
	}
	return out.ID, nil
}

func distinct(ids []int) int {
	seen := map[int]bool{}
	for _, id := range ids {
		seen[id] = true
	}
	return len(seen)
}

// TestLossyNetwork is the module's reason to exist: 1,000 orders through a
// network that loses responses after the server handled them. The client
// retries each with its key until it succeeds, and every store lets each
// order run exactly once.
func TestLossyNetwork(t *testing.T) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			svc := newOrderService()
			mw, err := server.New(kind.New(t))
			require.NoError(t, err)
			srv := startServer(t, mw.Handler(svc))
			proxy := startProxy(t, srv.URL, lossy)
			tr := &http.Transport{MaxIdleConnsPerHost: workers}
			t.Cleanup(tr.CloseIdleConnections)
			client := clienttest.New(t,
				idempotency.WithHTTPClient(&http.Client{Transport: tr}),
				idempotency.WithAttemptTimeout(attemptTimeout),
				idempotency.WithBackoff(time.Millisecond, 20*time.Millisecond),
				idempotency.WithMaxAttempts(10),
				idempotency.WithBudget(nil),
			)
			var attempts atomic.Int64
			ids := submitAll(t, func(ref string) (int, error) {
				// One key per order, kept across this loop's own
				// retries too.
				ctx := idempotency.ContextWithKey(context.Background(), "key-"+ref)
				resp, err := client.Post(ctx, proxy.URL()+"/orders", "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
				if err != nil {
					var re *idempotency.RetryError
					if errors.As(err, &re) {
						attempts.Add(int64(re.Attempts))
					}
					return 0, err
				}
				out, _ := idempotency.OutcomeOf(resp)
				attempts.Add(int64(out.Attempts))
				return decodeOrder(resp)
			})
			executions, duplicated := svc.totals()
			st := proxy.Stats()
			t.Logf("%d orders, %d attempts; proxy: %d requests, %d dropped, %d reset, %d delayed",
				orders, attempts.Load(), st.Requests, st.Dropped, st.Reset, st.Delayed)
			assert.Positive(t, st.Dropped, "the network lost no response: the test proves nothing")
			assert.Equal(t, orders, executions, "executions")
			assert.Zero(t, duplicated, "orders executed more than once")
			assert.Len(t, ids, orders)
			assert.Equal(t, orders, distinct(ids), "distinct orders received")
		})
	}
}

// TestLossyNetworkNaive is the same run with a client that retries without a
// key, against the same service: every lost response becomes a duplicate.
func TestLossyNetworkNaive(t *testing.T) {
	svc := newOrderService()
	srv := startServer(t, svc)
	proxy := startProxy(t, srv.URL, faultnet.Config{DropRate: lossy.DropRate, Seed: lossy.Seed})
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	ids := submitAll(t, func(ref string) (int, error) {
		resp, err := client.Post(proxy.URL()+"/orders", "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
		if err != nil {
			return 0, err
		}
		return decodeOrder(resp)
	})
	executions, duplicated := svc.totals()
	st := proxy.Stats()
	t.Logf("naive: %d orders submitted, %d executions, %d orders duplicated, %d responses dropped",
		orders, executions, duplicated, st.Dropped)
	assert.Len(t, ids, orders, "every order eventually got a response")
	assert.Positive(t, duplicated, "the naive client made no duplicate: the test proves nothing")
	assert.Equal(t, orders+int(st.Dropped), executions, "every dropped response became one more execution")
}
