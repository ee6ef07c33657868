// Command orders is the module's demo: a client submits orders to an API
// through a network that loses responses, first retrying naively, then with
// this module's client and middleware, and shows what each did.
//
//	go run ./examples/orders                      # in-memory store
//	go run ./examples/orders -store postgres      # or redis; see -h
//
// It starts the API (package server's middleware around an order handler),
// a lossy proxy in front of it that drops a share of the responses after the
// API handled the request, resets some connections before it sees them, and
// delays some past the client's per-attempt timeout, and then submits -n
// orders from -c concurrent workers, each until it succeeds:
//
//   - naive: an http.Client that retries every failure without a key. Each
//     lost response becomes a duplicate order.
//   - idempotency: idempotency.Client, which sends one key per order on
//     every attempt; the middleware runs each key once and replays it.
//
// The API accepts requests without a key (server.WithKeyOptional), so that
// the naive run reaches it; a real API would require keys.
//
// It exits with status 1 if the idempotent run created a duplicate or
// failed an order.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/faultnet"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
	"github.com/idemkit/idempotency/server/pgstore"
	"github.com/idemkit/idempotency/server/redisstore"
)

type options struct {
	orders, workers    int
	store, pgURL       string
	redisURL           string
	drop, reset, delay float64
	hold, timeout      time.Duration
	seed               uint64
}

func main() {
	var o options
	flag.IntVar(&o.orders, "n", 300, "orders to submit in each run")
	flag.IntVar(&o.workers, "c", 16, "concurrent workers")
	flag.StringVar(&o.store, "store", "memory", "the API's store: memory, postgres or redis")
	flag.StringVar(&o.pgURL, "postgres-url", envOr("IDEMPOTENCY_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL, for -store postgres")
	flag.StringVar(&o.redisURL, "redis-url", envOr("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL, for -store redis")
	flag.Float64Var(&o.drop, "drop", 0.2, "share of responses dropped after the API handled the request")
	flag.Float64Var(&o.reset, "reset", 0.05, "share of connections reset before the API saw the request")
	flag.Float64Var(&o.delay, "delay", 0.05, "share of responses held past the client's attempt timeout")
	flag.DurationVar(&o.hold, "hold", time.Second, "how long a delayed response is held")
	flag.DurationVar(&o.timeout, "timeout", 300*time.Millisecond, "the client's per-attempt timeout")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the proxy's faults (0: random)")
	flag.Parse()
	if _, err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// tally is what one run did.
type tally struct {
	name      string
	submitted int
	requests  int64 // as the proxy saw them
	lost      int64 // responses dropped or delayed past the timeout
	resets    int64
	replays   int64
	created   int
	distinct  int
	failures  atomic.Int64
}

// run runs the demo and returns the naive run's tally, then the idempotent
// run's.
func run(o options, out io.Writer) ([]*tally, error) {
	if o.orders < 1 || o.workers < 1 {
		return nil, errors.New("-n and -c must be at least 1")
	}
	ctx := context.Background()
	store, closeStore, err := openStore(ctx, o)
	if err != nil {
		return nil, err
	}
	defer closeStore()

	api := newOrderAPI()
	mw, err := server.New(store, server.WithKeyOptional())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: api.countReplays(mw.Handler(api)), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	defer srv.Close()

	proxy, err := faultnet.Start("http://"+ln.Addr().String(), faultnet.Config{
		DropRate: o.drop, ResetRate: o.reset, DelayRate: o.delay, Delay: o.hold, Seed: o.seed,
	})
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	url := proxy.URL() + "/orders"

	fmt.Fprintf(out, "API on %s with the %s store, behind a proxy that drops %.0f%% of responses, resets %.0f%% of connections and delays %.0f%% past the %v attempt timeout.\n",
		ln.Addr(), o.store, 100*o.drop, 100*o.reset, 100*o.delay, o.timeout)
	fmt.Fprintf(out, "Submitting %d orders from %d workers, each until it succeeds.\n\n", o.orders, o.workers)

	tr := &http.Transport{MaxIdleConnsPerHost: o.workers}
	defer tr.CloseIdleConnections()
	naive := &http.Client{Transport: tr, Timeout: o.timeout}
	keyed := idempotency.NewClient(
		idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		idempotency.WithAttemptTimeout(o.timeout),
		idempotency.WithBackoff(5*time.Millisecond, 100*time.Millisecond),
		idempotency.WithMaxAttempts(8),
	)

	runs := []*tally{
		submit(o, out, api, proxy, "naive retries", func(ref string) error {
			resp, err := naive.Post(url, "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
			return finish(resp, err)
		}),
		submit(o, out, api, proxy, "idempotency keys", func(ref string) error {
			// One key per order, for every attempt of every try.
			ctx := idempotency.WithKey(ctx, "order-"+ref)
			resp, err := keyed.Post(ctx, url, "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
			return finish(resp, err)
		}),
	}
	fmt.Fprintln(out)
	report(out, runs)
	idem := runs[1]
	if dup := idem.created - idem.distinct; dup > 0 || idem.failures.Load() > 0 {
		return runs, fmt.Errorf("the idempotent run created %d duplicates and failed %d orders", dup, idem.failures.Load())
	}
	return runs, nil
}

// finish reads a response and says whether the order was created.
func finish(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// submit submits o.orders orders, each retried by try until it succeeds
// (at most 20 tries), and reports progress.
func submit(o options, out io.Writer, api *orderAPI, proxy *faultnet.Proxy, name string, try func(ref string) error) *tally {
	t := &tally{name: name, submitted: o.orders}
	before := proxy.Stats()
	replaysBefore := api.replays.Load()
	prefix := strings.Fields(name)[0]

	var done atomic.Int64
	refs := make(chan string)
	var wg sync.WaitGroup
	for range o.workers {
		wg.Go(func() {
			for ref := range refs {
				var err error
				for range 20 {
					if err = try(ref); err == nil {
						break
					}
				}
				if err != nil {
					t.failures.Add(1)
				}
				done.Add(1)
			}
		})
	}
	stop := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(out, name, o.orders, &done, stop)
	}()
	for i := range o.orders {
		refs <- fmt.Sprintf("%s-%05d", prefix, i)
	}
	close(refs)
	wg.Wait()
	close(stop)
	<-progressDone

	after := proxy.Stats()
	t.requests = after.Requests - before.Requests
	t.lost = (after.Dropped - before.Dropped) + (after.Delayed - before.Delayed)
	t.resets = after.Reset - before.Reset
	t.replays = api.replays.Load() - replaysBefore
	t.created, t.distinct = api.created(prefix)
	return t
}

// progress prints how many orders are done, in place on a terminal and a
// line a second otherwise, until stop is closed.
func progress(out io.Writer, name string, total int, done *atomic.Int64, stop <-chan struct{}) {
	tty := false
	if f, ok := out.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			tty = fi.Mode()&os.ModeCharDevice != 0
		}
	}
	every := time.Second
	if tty {
		every = 100 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	show := func(final bool) {
		line := fmt.Sprintf("%-18s %4d/%d orders done", name, done.Load(), total)
		switch {
		case tty && final:
			fmt.Fprintf(out, "\r%s\n", line)
		case tty:
			fmt.Fprintf(out, "\r%s", line)
		default:
			fmt.Fprintln(out, line)
		}
	}
	for {
		select {
		case <-stop:
			show(true)
			return
		case <-tick.C:
			show(false)
		}
	}
}

func report(out io.Writer, runs []*tally) {
	row := func(label string, f func(*tally) int64) {
		fmt.Fprintf(out, "%-22s", label)
		for _, t := range runs {
			fmt.Fprintf(out, " %18d", f(t))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "%-22s", "")
	for _, t := range runs {
		fmt.Fprintf(out, " %18s", t.name)
	}
	fmt.Fprintln(out)
	row("orders submitted", func(t *tally) int64 { return int64(t.submitted) })
	row("requests sent", func(t *tally) int64 { return t.requests })
	row("responses lost", func(t *tally) int64 { return t.lost })
	row("connections reset", func(t *tally) int64 { return t.resets })
	row("replays served", func(t *tally) int64 { return t.replays })
	row("orders created", func(t *tally) int64 { return int64(t.created) })
	row("duplicates", func(t *tally) int64 { return int64(t.created - t.distinct) })
	row("failures", func(t *tally) int64 { return t.failures.Load() })
}

// orderAPI creates an order per execution, remembering the client's
// reference of each.
type orderAPI struct {
	mu      sync.Mutex
	next    int
	byRef   map[string]int
	replays atomic.Int64
}

func newOrderAPI() *orderAPI { return &orderAPI{byRef: map[string]int{}} }

func (a *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	ref, ok := strings.CutPrefix(string(body), `{"ref":"`)
	ref, ok2 := strings.CutSuffix(ref, `"}`)
	if err != nil || !ok || !ok2 {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.next++
	id := a.next
	a.byRef[ref]++
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"ref":%q}`, id, ref)
}

// created returns the orders created for references with prefix, and how
// many references they were for.
func (a *orderAPI) created(prefix string) (orders, refs int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ref, n := range a.byRef {
		if strings.HasPrefix(ref, prefix+"-") {
			orders += n
			refs++
		}
	}
	return orders, refs
}

// countReplays counts the responses the middleware replayed.
func (a *orderAPI) countReplays(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if w.Header().Get(server.DefaultReplayHeader) == "true" {
			a.replays.Add(1)
		}
	})
}

func openStore(ctx context.Context, o options) (server.Store, func(), error) {
	switch o.store {
	case "memory":
		s := memstore.New()
		return s, func() { s.Close() }, nil
	case "postgres":
		pool, err := pgxpool.New(ctx, o.pgURL)
		if err != nil {
			return nil, nil, errors.New("cannot use -postgres-url: not a valid PostgreSQL URL")
		}
		s, err := pgstore.New(pool, pgstore.WithTable("idempotency_orders_demo"))
		if err == nil {
			err = s.Migrate(ctx)
		}
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("PostgreSQL: %w", err)
		}
		// Start each demo afresh: its keys are the same on every run.
		pool.Exec(ctx, "TRUNCATE idempotency_orders_demo")
		return s, func() { s.Close(); pool.Close() }, nil
	case "redis":
		opt, err := redis.ParseURL(o.redisURL)
		if err != nil {
			return nil, nil, errors.New("cannot use -redis-url: not a valid Redis URL")
		}
		client := redis.NewClient(opt)
		prefix := fmt.Sprintf("idempotency-orders-demo:%d:", time.Now().UnixNano())
		s, err := redisstore.New(client, redisstore.WithPrefix(prefix))
		if err == nil {
			err = client.Ping(ctx).Err()
		}
		if err != nil {
			client.Close()
			return nil, nil, fmt.Errorf("redis: %w", err)
		}
		return s, func() { client.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown store %q: memory, postgres or redis", o.store)
}
