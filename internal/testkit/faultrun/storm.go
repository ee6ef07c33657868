package faultrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// StormConfig describes an outage: the store fails, so that the middleware
// answers every request with 503 and Retry-After, while callers keep placing
// operations through one idempotency.Client.
type StormConfig struct {
	// Operations are placed during the storm (default 1000), After once
	// it is over (default 600), by Callers concurrent callers (default
	// 50). The storm ends once every one of its operations has been sent
	// at least once.
	Operations, After, Callers int
	// Budget is the capacity of the client's retry budget, so that the
	// report can say how it drained and refilled; 0 runs the client
	// without one.
	Budget int
	// ClientOptions come after the storm's own (the budget).
	ClientOptions []idempotency.Option
}

// StormReport is what a Storm observed.
type StormReport struct {
	// Operations counts the storm's operations, Requests the requests they
	// sent (all of their attempts, during the storm and after it), and
	// Amplification is Requests per operation.
	Operations    int
	Requests      int
	Amplification float64
	// Stopped counts why the storm's operations stopped retrying, such as
	// "retry budget exhausted" or "attempts exhausted".
	Stopped map[string]int
	// Succeeded counts the storm's operations that succeeded in the end
	// (their last attempt came after the storm).
	Succeeded int
	// BudgetLeft is what the budget held when the storm ended.
	BudgetLeft int

	// FirstSuccess is the time from the storm's end to the first operation
	// that succeeded; Drained, to the return of the storm's last
	// operation. Refilled is the time it took the budget to be full again,
	// after RefillSuccesses successful operations (zero without a budget,
	// -1 if it never was during the run). AfterFailed counts the
	// operations after the storm that failed.
	FirstSuccess, Drained, Refilled time.Duration
	RefillSuccesses, AfterFailed    int
}

// Storm runs an outage against the middleware on a memstore whose Claim
// fails, and then the recovery: see StormConfig and StormReport.
func Storm(ctx context.Context, cfg StormConfig) (*StormReport, error) {
	if cfg.Operations <= 0 {
		cfg.Operations = 1000
	}
	if cfg.After <= 0 {
		cfg.After = 600
	}
	if cfg.Callers <= 0 {
		cfg.Callers = 50
	}
	mem, err := memstore.New()
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	defer mem.Close()
	store := faultstore.New(mem)
	mw, err := server.New(store)
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	seen := newKeyCounter(cfg.Operations)
	api := NewOrders()
	srv, err := serve(seen.wrap(mw.Handler(api)))
	if err != nil {
		return nil, err
	}
	defer srv.close()
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Callers}
	defer tr.CloseIdleConnections()
	// What the budget holds, as the client's events tell.
	var left atomic.Int64
	left.Store(int64(cfg.Budget))
	var budget *idempotency.Budget
	if cfg.Budget > 0 {
		budget = idempotency.NewBudget(cfg.Budget)
	}
	opts := []idempotency.Option{
		idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		idempotency.WithBudget(budget),
		idempotency.WithObserver(func(_ context.Context, e idempotency.Event) { left.Store(int64(e.Budget)) }),
	}
	client, err := idempotency.NewClient(append(opts, cfg.ClientOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}

	store.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("faultrun: storm")})
	rep := &StormReport{Operations: cfg.Operations, Stopped: map[string]int{}, RefillSuccesses: -1}
	var (
		mu         sync.Mutex
		ended      time.Time // when the storm ended
		successes  int       // after it
		lastStorm  time.Time
		firstAfter time.Time
	)
	refilled := cfg.Budget == 0
	next := make(chan int)
	var callers sync.WaitGroup
	for range cfg.Callers {
		callers.Go(func() {
			for i := range next {
				key := fmt.Sprintf("op-%06d", i)
				ok, stopped := place(ctx, client, srv.url+"/orders", key)
				now := time.Now()
				mu.Lock()
				if i < cfg.Operations {
					lastStorm = now
					if ok {
						rep.Succeeded++
					} else if stopped != "" {
						rep.Stopped[stopped]++
					}
				} else if !ok {
					rep.AfterFailed++
				}
				if ok && !ended.IsZero() {
					successes++
					if firstAfter.IsZero() {
						firstAfter = now
					}
					if !refilled && left.Load() == int64(cfg.Budget) {
						refilled = true
						rep.Refilled, rep.RefillSuccesses = now.Sub(ended), successes
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range cfg.Operations + cfg.After {
		if i == cfg.Operations {
			// Every operation of the storm has been sent once: end it.
			select {
			case <-seen.all:
			case <-ctx.Done():
			}
			mu.Lock()
			store.Clear(faultstore.Claim)
			ended = time.Now()
			if cfg.Budget > 0 {
				rep.BudgetLeft = int(left.Load())
			}
			mu.Unlock()
		}
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	callers.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep.Requests = seen.total(cfg.Operations)
	rep.Amplification = float64(rep.Requests) / float64(cfg.Operations)
	if !firstAfter.IsZero() {
		rep.FirstSuccess = firstAfter.Sub(ended)
	}
	rep.Drained = max(lastStorm.Sub(ended), 0)
	if cfg.Budget == 0 {
		rep.RefillSuccesses = 0
	}
	return rep, nil
}

// place makes one operation, and says whether it succeeded and, if not,
// why the client stopped retrying.
func place(ctx context.Context, c *idempotency.Client, url, key string) (ok bool, stopped string) {
	resp, err := c.Post(idempotency.ContextWithKey(ctx, key), url, "application/json", strings.NewReader(`{"ref":"`+key+`"}`))
	if err != nil {
		var re *idempotency.RetryError
		if errors.As(err, &re) && re.Stopped != nil {
			return false, strings.TrimPrefix(re.Stopped.Error(), "idempotency: ")
		}
		return false, "error"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode == http.StatusCreated {
		return true, ""
	}
	out, _ := idempotency.OutcomeOf(resp)
	if out.Stopped != nil {
		return false, strings.TrimPrefix(out.Stopped.Error(), "idempotency: ")
	}
	return false, fmt.Sprint(resp.StatusCode)
}

// keyCounter counts the requests for each operation, and closes all once
// the first n operations have each been seen.
type keyCounter struct {
	n     int
	limit string // the key of operation n: the first n keys sort before it
	all   chan struct{}

	mu     sync.Mutex
	counts map[string]int
	firsts int
}

func newKeyCounter(n int) *keyCounter {
	return &keyCounter{n: n, limit: fmt.Sprintf("op-%06d", n), all: make(chan struct{}), counts: map[string]int{}}
}

func (k *keyCounter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		k.mu.Lock()
		k.counts[key]++
		if k.counts[key] == 1 && key < k.limit {
			k.firsts++
			if k.firsts == k.n {
				close(k.all)
			}
		}
		k.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// total returns the requests of the first n operations.
func (k *keyCounter) total(n int) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	sum := 0
	for i := range n {
		sum += k.counts[fmt.Sprintf("op-%06d", i)]
	}
	return sum
}
