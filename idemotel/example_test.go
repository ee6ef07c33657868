package idemotel_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

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

// orders stands for the application's handler.
var orders = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
})

// show prints what an exporter would get: the requests and operations by
// outcome, the records the store holds, and the spans, by name.
func show(ctx context.Context, reader *sdkmetric.ManualReader, spans *tracetest.SpanRecorder) {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		fmt.Println(err)
		return
	}
	var lines []string
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			var points []string
			for _, p := range data.DataPoints {
				if outcome, ok := p.Attributes.Value("idempotency.outcome"); ok {
					points = append(points, fmt.Sprintf("%s %d", outcome.AsString(), p.Value))
				}
			}
			if len(points) > 0 {
				sort.Strings(points)
				lines = append(lines, m.Name+": "+strings.Join(points, ", "))
			}
		case metricdata.Gauge[int64]:
			if m.Name == "idempotency.store.records" {
				lines = append(lines, fmt.Sprintf("%s: %d", m.Name, data.DataPoints[0].Value))
			}
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	count := map[string]int{}
	for _, s := range spans.Ended() {
		count[s.Name()]++
	}
	var names []string
	for name, n := range count {
		names = append(names, fmt.Sprintf("%s %d", name, n))
	}
	sort.Strings(names)
	fmt.Println("spans:", strings.Join(names, ", "))
}

// The middleware, a client and a store, observed: the client sends one
// order twice under one key, and the second answer is a replay. The
// providers keep what they get in memory here, where a program's would
// export it.
func ExampleServerObserver() {
	ctx := context.Background()
	// mp and tp: your SDK's MeterProvider and TracerProvider (or leave the
	// options out to use the global ones, otel.GetMeterProvider and
	// otel.GetTracerProvider).
	reader, spans := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx)

	memStore, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer memStore.Close()
	observe, err := idemotel.ServerObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	mw, err := server.New(memStore, server.WithConfig(engine.Config{Observer: observe}))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(orders))
	defer srv.Close()

	observeClient, err := idemotel.ClientObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	client, err := idempotency.NewClient(idempotency.WithHTTPClient(srv.Client()), idempotency.WithObserver(observeClient))
	if err != nil {
		log.Fatal(err)
	}

	// A memstore counts its records and bytes; read when the metrics are collected.
	reg, err := idemotel.RegisterStoreSize(func(context.Context) (int64, int64, error) {
		return int64(memStore.Len()), memStore.Bytes(), nil
	}, idemotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Unregister()

	order := idempotency.ContextWithKey(ctx, "order-1")
	for range 2 {
		resp, err := client.Post(order, srv.URL+"/orders", "application/json", strings.NewReader(`{"sku":"A1"}`))
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	srv.Close() // the middleware tells its observer just after it answers: Close waits for it
	show(ctx, reader, spans)
	// Output:
	// idempotency.client.operations: completed 1, replayed 1
	// idempotency.server.requests: executed 1, replayed 1
	// idempotency.store.records: 1
	// spans: idempotency.attempt 2, idempotency.claim 2, idempotency.complete 1, idempotency.handler 1, idempotency.operation 2, idempotency.request 2
}
