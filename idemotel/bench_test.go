package idemotel_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemotel"
)

// BenchmarkObserve measures what recording one event costs with the SDK:
// metrics only (spans not sampled), and metrics and spans (sampled, and
// dropped since no processor is registered).
func BenchmarkObserve(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	samplers := []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"metrics", sdktrace.NeverSample()}, {"metrics_spans", sdktrace.AlwaysSample()}}
	start := time.Now()
	executed := engine.Event{Kind: engine.EventExecuted, Scope: "s", Key: "k", Status: 201, Start: start,
		ClaimTook: time.Millisecond, HandlerTook: 5 * time.Millisecond, StoreTook: time.Millisecond, Acquired: true}
	completed := idempotency.Event{Kind: idempotency.EventCompleted, Key: "k", Method: "POST", Call: 1, Attempt: 1,
		Start: start, Sent: start, Took: 5 * time.Millisecond, Elapsed: 5 * time.Millisecond,
		Result: idempotency.ResultResponse, StatusCode: 201, Budget: 500}
	for _, s := range samplers {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s.sampler))
		opts := []idemotel.Option{idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp)}
		b.Run("server_"+s.name, func(b *testing.B) {
			observe, err := idemotel.ServerObserver(opts...)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				observe(ctx, executed)
			}
		})
		b.Run("client_"+s.name, func(b *testing.B) {
			observe, err := idemotel.ClientObserver(opts...)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				observe(ctx, completed)
			}
		})
		tp.Shutdown(context.Background())
	}
}
