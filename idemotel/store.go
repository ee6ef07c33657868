package idemotel

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// RegisterStoreSize makes two observable gauges, idempotency.store.records
// and idempotency.store.size (bytes), whose values size reports when the
// metrics are collected: no goroutine polls it in between. size returns how
// many records a store holds and how many bytes they take: pgstore's and
// redisstore's package documentation each give a query that does it, and a
// memstore.Store counts them itself (its Len and Bytes). size should be
// quick (a query is bounded by the context the SDK passes), and safe for
// concurrent use; an error it returns is the collection's, and reports
// nothing. Unregister the returned Registration to stop, for example when
// the store is closed.
func RegisterStoreSize(size func(ctx context.Context) (records, bytes int64, err error), opts ...Option) (metric.Registration, error) {
	if size == nil {
		return nil, errors.New("idemotel: RegisterStoreSize needs a size function")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := cfg.meter()
	records, err := m.Int64ObservableGauge("idempotency.store.records",
		metric.WithUnit("{record}"),
		metric.WithDescription("Records the store holds."))
	if err != nil {
		return nil, err
	}
	bytes, err := m.Int64ObservableGauge("idempotency.store.size",
		metric.WithUnit("By"),
		metric.WithDescription("Bytes the store's records take."))
	if err != nil {
		return nil, err
	}
	attrs := metric.WithAttributes(cfg.attrs...)
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		n, b, err := size(ctx)
		if err != nil {
			return fmt.Errorf("idemotel: store size: %w", err)
		}
		o.ObserveInt64(records, n, attrs)
		o.ObserveInt64(bytes, b, attrs)
		return nil
	}, records, bytes)
}
