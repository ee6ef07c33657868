package idemotel_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idempotency/idemotel"
)

// telemetry is an SDK that keeps what it gets in memory.
type telemetry struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	mp     *sdkmetric.MeterProvider
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t *testing.T) *telemetry {
	tm := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	tm.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tm.reader))
	tm.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tm.spans))
	t.Cleanup(func() {
		tm.mp.Shutdown(context.Background())
		tm.tp.Shutdown(context.Background())
	})
	return tm
}

// options points an observer at tm.
func (tm *telemetry) options(more ...idemotel.Option) []idemotel.Option {
	return append([]idemotel.Option{idemotel.WithMeterProvider(tm.mp), idemotel.WithTracerProvider(tm.tp)}, more...)
}

// collect returns the metrics so far, by name.
func (tm *telemetry) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tm.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "github.com/idemkit/idempotency/idemotel", sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// matches reports whether set has every attribute of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the points of the sum m whose attributes include want: 0 if
// there is no such metric yet.
func sum(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) int64 {
	t.Helper()
	if m.Data == nil {
		return 0
	}
	data, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T, want an int64 sum", m.Name, m.Data)
	var n int64
	for _, p := range data.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// count adds up the counts of the points of the histogram m whose
// attributes include want.
func count(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) uint64 {
	t.Helper()
	var n uint64
	switch data := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range data.DataPoints {
			if matches(p.Attributes, want) {
				n += p.Count
			}
		}
	case metricdata.Histogram[int64]:
		for _, p := range data.DataPoints {
			if matches(p.Attributes, want) {
				n += p.Count
			}
		}
	default:
		t.Fatalf("%s is a %T, want a histogram", m.Name, m.Data)
	}
	return n
}

// gauge returns the value of the gauge m's point whose attributes include
// want.
func gauge(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) int64 {
	t.Helper()
	data, ok := m.Data.(metricdata.Gauge[int64])
	require.True(t, ok, "%s is a %T, want an int64 gauge", m.Name, m.Data)
	for _, p := range data.DataPoints {
		if matches(p.Attributes, want) {
			return p.Value
		}
	}
	t.Fatalf("%s has no point with %v", m.Name, want)
	return 0
}

// spanNamed returns the ended spans called name whose attributes include
// want.
func (tm *telemetry) spansNamed(name string, want ...attribute.KeyValue) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tm.spans.Ended() {
		if s.Name() == name && matches(attribute.NewSet(s.Attributes()...), want) {
			out = append(out, s)
		}
	}
	return out
}

// children returns the names of the ended spans whose parent is s, in the
// order of their start.
func (tm *telemetry) children(s sdktrace.ReadOnlySpan) []string {
	var kids []sdktrace.ReadOnlySpan
	for _, c := range tm.spans.Ended() {
		if c.Parent().SpanID() == s.SpanContext().SpanID() {
			kids = append(kids, c)
		}
	}
	slices.SortStableFunc(kids, func(a, b sdktrace.ReadOnlySpan) int {
		return a.StartTime().Compare(b.StartTime())
	})
	var names []string
	for _, k := range kids {
		names = append(names, k.Name())
	}
	return names
}

// attributeSets returns the attributes of every point of m.
func attributeSets(t *testing.T, m metricdata.Metrics) []attribute.Set {
	t.Helper()
	var sets []attribute.Set
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[int64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
		}
	default:
		t.Fatalf("%s is a %T", m.Name, m.Data)
	}
	return sets
}

// histSum adds up the sums of the points of the int64 histogram m.
func histSum(t *testing.T, m metricdata.Metrics) int64 {
	t.Helper()
	data, ok := m.Data.(metricdata.Histogram[int64])
	require.True(t, ok, "%s is a %T, want an int64 histogram", m.Name, m.Data)
	var n int64
	for _, p := range data.DataPoints {
		n += p.Sum
	}
	return n
}
