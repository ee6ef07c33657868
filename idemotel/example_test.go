package idemotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// The middleware and a client, observed; the metrics are read here with a
// ManualReader, where a program would export them.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	serverObserver, err := idemotel.ServerObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		fmt.Println(err)
		return
	}
	mw, err := server.New(store, server.WithConfig(engine.Config{Observer: serverObserver}))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	clientObserver, err := idemotel.ClientObserver(idemotel.WithMeterProvider(mp))
	if err != nil {
		fmt.Println(err)
		return
	}
	client, err := idempotency.NewClient(idempotency.WithHTTPClient(srv.Client()), idempotency.WithObserver(clientObserver))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := idempotency.ContextWithKey(context.Background(), "order-1")
	for range 2 {
		resp, err := client.Post(ctx, srv.URL, "application/json", strings.NewReader(`{"sku":"A1"}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}

	// The middleware tells its observer just after it answers: Close
	// waits for it.
	srv.Close()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		fmt.Println(err)
		return
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		sum, ok := m.Data.(metricdata.Sum[int64])
		if !ok || !sum.IsMonotonic {
			continue
		}
		for _, p := range sum.DataPoints {
			outcome, ok := p.Attributes.Value(attribute.Key("idempotency.outcome"))
			if !ok {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s %s=%s: %d", m.Name, attribute.Key("idempotency.outcome"), outcome.AsString(), p.Value))
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// idempotency.client.operations idempotency.outcome=completed: 1
	// idempotency.client.operations idempotency.outcome=replayed: 1
	// idempotency.server.requests idempotency.outcome=executed: 1
	// idempotency.server.requests idempotency.outcome=replayed: 1
}
