package idemotel

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// scopeName is the instrumentation scope of the meters and tracers of this
// package, as the package documentation says.
const scopeName = "github.com/idemkit/idempotency/idemotel"

// An Option configures an observer or a store's gauges. [ClientObserver],
// [ServerObserver] and [RegisterStoreSize] refuse an invalid one (a nil
// Option included) with an error that names every invalid option at once.
type Option func(*config)

type config struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	grpc           bool // Event.Status is a gRPC code (GRPCServerObserver)
	attrs          []attribute.KeyValue
	invalid        []error
}

// refuse records an invalid option, to be reported with the others.
func (c *config) refuse(format string, args ...any) {
	c.invalid = append(c.invalid, fmt.Errorf("idemotel: "+format, args...))
}

func newConfig(opts []Option) (config, error) {
	var c config
	for i, o := range opts {
		if o == nil {
			c.refuse("option %d is nil", i)
			continue
		}
		o(&c)
	}
	if err := errors.Join(c.invalid...); err != nil {
		return c, err
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	return c, nil
}

func (c *config) meter() metric.Meter { return c.meterProvider.Meter(scopeName) }

func (c *config) tracer() trace.Tracer { return c.tracerProvider.Tracer(scopeName) }

// WithMeterProvider sets the MeterProvider that makes the metrics; by
// default, the global one (otel.GetMeterProvider). A nil one is refused.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) {
		if mp == nil {
			c.refuse("WithMeterProvider needs a MeterProvider")
			return
		}
		c.meterProvider = mp
	}
}

// WithTracerProvider sets the TracerProvider that makes the spans; by
// default, the global one (otel.GetTracerProvider). A nil one is refused.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp == nil {
			c.refuse("WithTracerProvider needs a TracerProvider")
			return
		}
		c.tracerProvider = tp
	}
}

// WithAttributes adds attrs to every measurement and span, for example the
// name of the API or of the client, to tell apart the observers of several
// middlewares or clients in one process.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}
