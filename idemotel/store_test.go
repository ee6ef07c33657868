package idemotel_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestStoreSize: the gauges report a memstore's records and bytes when the
// metrics are collected, and nothing once unregistered.
func TestStoreSize(t *testing.T) {
	tm := newTelemetry(t)
	mem, err := memstore.New()
	require.NoError(t, err)
	defer mem.Close()
	reg, err := idemotel.RegisterStoreSize(func(context.Context) (int64, int64, error) { return int64(mem.Len()), mem.Bytes(), nil }, tm.options(idemotel.WithAttributes(attribute.String("store", "memory")))...)
	require.NoError(t, err)

	m := tm.collect(t)
	assert.Zero(t, gauge(t, m["idempotency.store.records"], attribute.String("store", "memory")))
	assert.Equal(t, "{record}", m["idempotency.store.records"].Unit)
	assert.Equal(t, "By", m["idempotency.store.size"].Unit)

	ctx := t.Context()
	for i := range 3 {
		id := engine.ID{Scope: "s", Key: "k" + strconv.Itoa(i)}
		c, err := mem.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, mem.Complete(ctx, id, c.Token, &engine.Response{Status: 201, Body: []byte("created")}, time.Hour))
	}
	m = tm.collect(t)
	assert.Equal(t, int64(3), gauge(t, m["idempotency.store.records"]))
	assert.Equal(t, mem.Bytes(), gauge(t, m["idempotency.store.size"]))
	assert.Positive(t, mem.Bytes())

	require.NoError(t, reg.Unregister())
	m = tm.collect(t)
	for _, name := range []string{"idempotency.store.records", "idempotency.store.size"} {
		if g, ok := m[name].Data.(metricdata.Gauge[int64]); ok {
			assert.Empty(t, g.DataPoints, "%s after Unregister", name)
		}
	}
}

// TestStoreSizeError: a size that fails reports nothing, and the
// collection says why.
func TestStoreSizeError(t *testing.T) {
	tm := newTelemetry(t)
	down := errors.New("down")
	_, err := idemotel.RegisterStoreSize(func(context.Context) (int64, int64, error) { return 0, 0, down }, tm.options()...)
	require.NoError(t, err)
	var rm metricdata.ResourceMetrics
	err = tm.reader.Collect(t.Context(), &rm)
	assert.ErrorIs(t, err, down)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
				assert.Empty(t, g.DataPoints, m.Name)
			}
		}
	}

	_, err = idemotel.RegisterStoreSize(nil)
	assert.Error(t, err)
}
