// Command orders is an orders API and the client that submits its orders,
// both observed with OpenTelemetry, over a network that loses responses.
//
// The client's transport loses the response of every -lose'th request after
// the API handled it, as a network can. The client retries with the key it
// made for the order, and the middleware replays the order it created, so
// that each order is created once. With -otel the program then writes the
// metrics of the middleware (idemotel.ServerObserver), of the client
// (idemotel.ClientObserver) and of the memory store (idemotel.RegisterStoreSize)
// to stdout, through the SDK's stdout exporter.
//
//	cd idemotel && go run ./examples/orders -otel
//
// It imports only public packages, so it can be copied as the start of a
// service of your own. The repository's larger demo, with naive retries to
// compare and a proxy that also resets and delays, is cmd/ordersdemo of the
// root module.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func main() {
	var c config
	flag.IntVar(&c.orders, "n", 20, "orders to submit")
	flag.IntVar(&c.lose, "lose", 3, "lose the response of every lose'th request (0: none)")
	flag.BoolVar(&c.otel, "otel", false, "write the metrics to stdout, through the OpenTelemetry stdout exporter")
	flag.Parse()
	if _, err := run(context.Background(), c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	orders, lose int
	otel         bool
}

// summary is what a run did.
type summary struct {
	submitted, created, lost, replayed int
}

func run(ctx context.Context, c config, out io.Writer) (summary, error) {
	if c.orders < 1 || c.lose < 0 {
		return summary{}, errors.New("-n must be at least 1 and -lose at least 0")
	}
	var opts []sdkmetric.Option
	if c.otel {
		exp, err := stdoutmetric.New(stdoutmetric.WithWriter(out), stdoutmetric.WithPrettyPrint())
		if err != nil {
			return summary{}, err
		}
		// Exported once, when the provider shuts down, not on a timer.
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(24*time.Hour))))
	}
	mp := sdkmetric.NewMeterProvider(opts...)

	store, err := memstore.New()
	if err != nil {
		return summary{}, err
	}
	defer store.Close()
	reg, err := idemotel.RegisterStoreSize(func(context.Context) (int64, int64, error) {
		return int64(store.Len()), store.Bytes(), nil
	}, idemotel.WithMeterProvider(mp))
	if err != nil {
		return summary{}, err
	}
	defer reg.Unregister()

	s, err := submit(ctx, c, store, mp, out)
	if c.otel {
		fmt.Fprintln(out, "\nOpenTelemetry metrics (stdout exporter):")
	}
	// Shutdown exports what the instruments recorded, the store's size
	// included: it is still registered.
	return s, errors.Join(err, mp.Shutdown(ctx))
}

// submit starts the API on store, submits the orders through a lossy transport and
// prints what happened.
func submit(ctx context.Context, c config, store engine.Store, mp *sdkmetric.MeterProvider, out io.Writer) (summary, error) {
	serverObserver, err := idemotel.ServerObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		return summary{}, err
	}
	mw, err := server.New(store, server.WithConfig(engine.Config{Observer: serverObserver}))
	if err != nil {
		return summary{}, err
	}
	api := &orderAPI{}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(api))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return summary{}, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()

	clientObserver, err := idemotel.ClientObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		return summary{}, err
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	lossy := &lossyTransport{base: tr, every: int64(c.lose)}
	client, err := idempotency.NewClient(
		idempotency.WithHTTPClient(&http.Client{Transport: lossy}),
		idempotency.WithBackoff(time.Millisecond, 20*time.Millisecond),
		idempotency.WithObserver(clientObserver),
	)
	if err != nil {
		return summary{}, err
	}

	s := summary{submitted: c.orders}
	url := "http://" + ln.Addr().String() + "/orders"
	for i := range c.orders {
		resp, err := client.Post(ctx, url, "application/json", strings.NewReader(fmt.Sprintf(`{"ref":"order-%d"}`, i)))
		if err != nil {
			return s, fmt.Errorf("order %d: %w", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return s, fmt.Errorf("order %d: status %d", i, resp.StatusCode)
		}
		if o, ok := idempotency.OutcomeOf(resp); ok && o.Replayed {
			s.replayed++
		}
	}
	s.created = api.count()
	s.lost = int(lossy.lost.Load())
	fmt.Fprintf(out, "orders submitted %d, created %d; responses lost %d, replayed %d\n", s.submitted, s.created, s.lost, s.replayed)
	if s.created != s.submitted {
		return s, fmt.Errorf("%d orders created for %d submitted", s.created, s.submitted)
	}
	return s, nil
}

// errLost is what the client is told when its response was lost.
var errLost = errors.New("response lost")

// lossyTransport loses the response of every every'th request, after the
// server handled it: the case that a retry without a key turns into a
// duplicate.
type lossyTransport struct {
	base  http.RoundTripper
	every int64
	n     atomic.Int64
	lost  atomic.Int64
}

func (t *lossyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || t.every == 0 || t.n.Add(1)%t.every != 0 {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	t.lost.Add(1)
	return nil, errLost
}

// orderAPI creates an order each time it runs.
type orderAPI struct {
	mu     sync.Mutex
	orders int
}

func (a *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(r.Body); err != nil {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.orders++
	id := a.orders
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`, id)
}

func (a *orderAPI) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.orders
}
