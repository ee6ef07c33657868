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
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/redisstore"
)

// Options configure the demo; Flags sets them from the command line.
type Options struct {
	Orders, Workers    int
	Store, PostgresURL string
	RedisURL           string
	Drop, Reset, Delay float64
	Hold, Timeout      time.Duration
	Seed               uint64
}

// Flags defines the demo's command-line flags in fs, with their defaults,
// to set o.
func (o *Options) Flags(fs *flag.FlagSet) {
	fs.IntVar(&o.Orders, "n", 300, "orders to submit in each run")
	fs.IntVar(&o.Workers, "c", 16, "concurrent workers")
	fs.StringVar(&o.Store, "store", "memory", "the API's store: memory, postgres or redis")
	fs.StringVar(&o.PostgresURL, "postgres-url", envOr("IDEMPOTENCY_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL URL, for -store postgres")
	fs.StringVar(&o.RedisURL, "redis-url", envOr("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL, for -store redis")
	fs.Float64Var(&o.Drop, "drop", 0.2, "share of responses dropped after the API handled the request")
	fs.Float64Var(&o.Reset, "reset", 0.05, "share of connections reset before the API saw the request")
	fs.Float64Var(&o.Delay, "delay", 0.05, "share of responses held past the client's attempt timeout")
	fs.DurationVar(&o.Hold, "hold", time.Second, "how long a delayed response is held")
	fs.DurationVar(&o.Timeout, "timeout", 300*time.Millisecond, "the client's per-attempt timeout")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the proxy's faults (0: random)")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Tally is what one run did.
type Tally struct {
	Name      string
	Submitted int
	Requests  int64 // as the proxy saw them
	Lost      int64 // responses dropped or delayed past the timeout
	Resets    int64
	Created   int
	Distinct  int
	Failures  atomic.Int64
	handled   int64 // requests that reached the API
	// Events counts the middleware's events of the run, by kind.
	Events map[engine.EventKind]int64
}

// counters counts the middleware's events by kind.
type counters [engine.EventAcquired + 1]atomic.Int64

func (c *counters) observe(_ context.Context, e engine.Event) {
	if e.Kind > 0 && int(e.Kind) < len(c) {
		c[e.Kind].Add(1)
	}
}

// since returns the counts since before.
func (c *counters) since(before map[engine.EventKind]int64) map[engine.EventKind]int64 {
	now := make(map[engine.EventKind]int64, len(c))
	for k := range c {
		kind := engine.EventKind(k)
		now[kind] = c[k].Load() - before[kind]
	}
	return now
}

// Run runs the demo, writing its progress and report to out, and returns
// the naive run's tally, then the idempotent run's. It fails if the
// idempotent run created a duplicate or failed an order.
func Run(o Options, out io.Writer) ([]*Tally, error) {
	if o.Orders < 1 || o.Workers < 1 {
		return nil, errors.New("-n and -c must be at least 1")
	}
	ctx := context.Background()
	store, closeStore, err := openStore(ctx, o)
	if err != nil {
		return nil, err
	}
	defer closeStore()

	api := newOrderAPI()
	var events counters
	mw, err := server.New(store, server.WithKeyOptional(), server.WithConfig(engine.Config{Observer: events.observe}),
		// The demo has one caller; a real API names the authenticated
		// principal here, so that callers never share keys.
		server.WithScope(func(*http.Request) (string, error) { return "demo", nil }))
	if err != nil {
		return nil, err
	}
	defer mw.Shutdown(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mw.Handler(api), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	defer srv.Close()

	proxy, err := faultnet.Start("http://"+ln.Addr().String(), faultnet.Config{
		DropRate: o.Drop, ResetRate: o.Reset, DelayRate: o.Delay, Delay: o.Hold, Seed: o.Seed,
	})
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	url := proxy.URL() + "/orders"

	fmt.Fprintf(out, "API on %s with the %s store, behind a proxy that drops %.0f%% of responses, resets %.0f%% of connections and delays %.0f%% past the %v attempt timeout.\n",
		ln.Addr(), o.Store, 100*o.Drop, 100*o.Reset, 100*o.Delay, o.Timeout)
	fmt.Fprintf(out, "Submitting %d orders from %d workers, each until it succeeds.\n\n", o.Orders, o.Workers)

	tr := &http.Transport{MaxIdleConnsPerHost: o.Workers}
	defer tr.CloseIdleConnections()
	naive := &http.Client{Transport: tr, Timeout: o.Timeout}
	keyed, err := idempotency.NewClient(
		idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		idempotency.WithAttemptTimeout(o.Timeout),
		idempotency.WithBackoff(5*time.Millisecond, 100*time.Millisecond),
		idempotency.WithMaxAttempts(8),
	)
	if err != nil {
		return nil, err
	}

	type attempt struct {
		name string
		try  func(ref string) error
	}
	var runs []*Tally
	for _, a := range []attempt{
		{"naive retries", func(ref string) error {
			resp, err := naive.Post(url, "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
			return finish(resp, err)
		}},
		{"idempotency keys", func(ref string) error {
			// One key per order, for every attempt of every try.
			ctx := idempotency.ContextWithKey(ctx, "order-"+ref)
			resp, err := keyed.Post(ctx, url, "application/json", strings.NewReader(`{"ref":"`+ref+`"}`))
			return finish(resp, err)
		}},
	} {
		before := events.since(nil)
		t := submit(o, out, api, proxy, a.name, a.try)
		// The middleware tells its observer after the response is
		// written: wait until it has told of every request the proxy
		// passed on, or a little while.
		waitEvents(&events, before, t.handled)
		t.Events = events.since(before)
		runs = append(runs, t)
	}
	fmt.Fprintln(out)
	report(out, runs)
	fmt.Fprintln(out)
	reportEvents(out, runs)
	idem := runs[1]
	if dup := idem.Created - idem.Distinct; dup > 0 || idem.Failures.Load() > 0 {
		return runs, fmt.Errorf("the idempotent run created %d duplicates and failed %d orders", dup, idem.Failures.Load())
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

// submit submits o.Orders orders, each retried by try until it succeeds
// (at most 20 tries), and reports progress.
func submit(o Options, out io.Writer, api *orderAPI, proxy *faultnet.Proxy, name string, try func(ref string) error) *Tally {
	t := &Tally{Name: name, Submitted: o.Orders}
	before := proxy.Stats()
	prefix := strings.Fields(name)[0]

	var done atomic.Int64
	refs := make(chan string)
	var wg sync.WaitGroup
	for range o.Workers {
		wg.Go(func() {
			for ref := range refs {
				var err error
				for range 20 {
					if err = try(ref); err == nil {
						break
					}
				}
				if err != nil {
					t.Failures.Add(1)
				}
				done.Add(1)
			}
		})
	}
	stop := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(out, name, o.Orders, &done, stop)
	}()
	for i := range o.Orders {
		refs <- fmt.Sprintf("%s-%05d", prefix, i)
	}
	close(refs)
	wg.Wait()
	close(stop)
	<-progressDone

	after := proxy.Stats()
	t.Requests = after.Requests - before.Requests
	t.Lost = (after.Dropped - before.Dropped) + (after.Delayed - before.Delayed)
	t.Resets = after.Reset - before.Reset
	t.handled = t.Requests - t.Resets - (after.UpstreamErrors - before.UpstreamErrors)
	t.Created, t.Distinct = api.created(prefix)
	return t
}

// finalKinds are the kinds of the events that end a request.
var finalKinds = []engine.EventKind{
	engine.EventExecuted, engine.EventReplayed, engine.EventInFlight, engine.EventMismatch,
	engine.EventRejected, engine.EventUnavailable, engine.EventReleased, engine.EventNotStored,
	engine.EventUnprotected, engine.EventClientGone,
}

// waitEvents waits, for a second at most, until the middleware has told of
// n requests since before: it tells its observer just after it answers.
func waitEvents(c *counters, before map[engine.EventKind]int64, n int64) {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var got int64
		now := c.since(before)
		for _, k := range finalKinds {
			got += now[k]
		}
		if got >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
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

func report(out io.Writer, runs []*Tally) {
	row := func(label string, f func(*Tally) int64) {
		fmt.Fprintf(out, "%-22s", label)
		for _, t := range runs {
			fmt.Fprintf(out, " %18d", f(t))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "%-22s", "")
	for _, t := range runs {
		fmt.Fprintf(out, " %18s", t.Name)
	}
	fmt.Fprintln(out)
	row("orders submitted", func(t *Tally) int64 { return int64(t.Submitted) })
	row("requests sent", func(t *Tally) int64 { return t.Requests })
	row("responses lost", func(t *Tally) int64 { return t.Lost })
	row("connections reset", func(t *Tally) int64 { return t.Resets })
	row("replays served", func(t *Tally) int64 { return t.Events[engine.EventReplayed] })
	row("orders created", func(t *Tally) int64 { return int64(t.Created) })
	row("duplicates", func(t *Tally) int64 { return int64(t.Created - t.Distinct) })
	row("failures", func(t *Tally) int64 { return t.Failures.Load() })
}

// reportEvents prints, for each run, what the middleware told its observer
// it did with the requests that reached it.
func reportEvents(out io.Writer, runs []*Tally) {
	fmt.Fprintf(out, "%-22s", "middleware events")
	for _, t := range runs {
		fmt.Fprintf(out, " %18s", t.Name)
	}
	fmt.Fprintln(out)
	for _, r := range []struct {
		label string
		kind  engine.EventKind
	}{
		{"first executions", engine.EventExecuted},
		{"replays", engine.EventReplayed},
		{"409 in flight", engine.EventInFlight},
		{"503 store failed", engine.EventUnavailable},
		{"released for a retry", engine.EventReleased},
		{"without a key", engine.EventUnprotected},
	} {
		fmt.Fprintf(out, "%-22s", r.label)
		for _, t := range runs {
			fmt.Fprintf(out, " %18d", t.Events[r.kind])
		}
		fmt.Fprintln(out)
	}
}

// orderAPI creates an order per execution, remembering the client's
// reference of each.
type orderAPI struct {
	mu    sync.Mutex
	next  int
	byRef map[string]int
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

func openStore(ctx context.Context, o Options) (engine.Store, func(), error) {
	switch o.Store {
	case "memory":
		s, err := memstore.New()
		if err != nil {
			return nil, nil, err
		}
		return s, func() { s.Close() }, nil
	case "postgres":
		pool, err := pgxpool.New(ctx, o.PostgresURL)
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
		opt, err := redis.ParseURL(o.RedisURL)
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
	return nil, nil, fmt.Errorf("unknown store %q: memory, postgres or redis", o.Store)
}
