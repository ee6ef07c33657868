package idemotel

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idempotency/engine"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// durationBuckets are the bounds, in seconds, of the duration histograms:
// those of the HTTP semantic conventions, with finer ones below 5 ms for
// the stores, whose replays take a fraction of a millisecond.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// answered reports whether e's Status is the status of an answer: a caller
// that went away got none, and a released or unprotected call reports 0
// when its status is unknown (a panic, work run without protection). For a
// gRPC door, whose OK is 0, such a 0 must not be read as OK.
func answered(e engine.Event) bool {
	switch e.Kind {
	case engine.EventClientGone:
		return false
	case engine.EventReleased, engine.EventUnprotected:
		return e.Status != 0
	}
	return true
}

// serverObserver turns the middleware's events into metrics and spans.
type serverObserver struct {
	cfg    config
	tracer trace.Tracer

	requests metric.Int64Counter
	active   metric.Int64UpDownCounter
	store    metric.Float64Histogram
	handler  metric.Float64Histogram
	renewals metric.Int64Counter
	losses   metric.Int64Counter

	common   metric.MeasurementOption // the attributes of WithAttributes
	outcomes setCache[outcomeSet]
	ops      setCache[opSet]
}

type outcomeSet struct {
	kind   engine.EventKind
	status int
}

type opSet struct{ op, errType string }

// ServerObserver returns an observer for the HTTP middleware (the Observer
// of the engine.Config given to server.WithConfig), or for the function
// door (package once), that records each event as metrics and spans; the
// package documentation and the README list them. An event's Status is an
// HTTP status code, as those doors report it. It fails on an invalid
// option, or if an instrument cannot be made.
func ServerObserver(opts ...Option) (engine.Observer, error) {
	return newServerObserver(opts, false)
}

// GRPCServerObserver is ServerObserver for the gRPC door (the Observer of
// the engine.Config given to idemgrpc's WithConfig), whose events carry
// the gRPC code they answered with: it is recorded as
// rpc.response.status_code, by name ("OK", "ALREADY_EXISTS", ...), instead
// of http.response.status_code, and error.type and the span's error status
// follow the gRPC semantic conventions for a server (UNKNOWN,
// DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE and DATA_LOSS are
// errors).
func GRPCServerObserver(opts ...Option) (engine.Observer, error) {
	return newServerObserver(opts, true)
}

func newServerObserver(opts []Option, grpc bool) (engine.Observer, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	cfg.grpc = grpc
	m := cfg.meter()
	o := &serverObserver{cfg: cfg, tracer: cfg.tracer(), common: metric.WithAttributes(cfg.attrs...)}
	var e error
	o.requests, e = m.Int64Counter("idempotency.server.requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Protected requests, by what the middleware did with them."))
	err = errors.Join(err, e)
	o.active, e = m.Int64UpDownCounter("idempotency.server.active_claims",
		metric.WithUnit("{claim}"),
		metric.WithDescription("Keys claimed by requests of this process that are still running."))
	err = errors.Join(err, e)
	o.store, e = m.Float64Histogram("idempotency.server.store.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of the middleware's store operations, retries and waits included."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	o.handler, e = m.Float64Histogram("idempotency.server.handler.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of the protected handler, for requests that ran it."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	o.renewals, e = m.Int64Counter("idempotency.server.lease.renewals",
		metric.WithUnit("{renewal}"),
		metric.WithDescription("Leases extended while their handler ran."))
	err = errors.Join(err, e)
	o.losses, e = m.Int64Counter("idempotency.server.lease.losses",
		metric.WithUnit("{loss}"),
		metric.WithDescription("Leases lost, or ended without renewal, whose handler was cancelled."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return o.observe, nil
}

func (o *serverObserver) observe(ctx context.Context, e engine.Event) {
	switch e.Kind {
	case engine.EventAcquired:
		o.active.Add(ctx, 1, o.common)
		return
	case engine.EventLeaseRenewed:
		o.renewals.Add(ctx, 1, o.common)
		o.recordStore(ctx, "extend", e.StoreTook, "")
		o.leaseEvent(ctx, "idempotency.lease.renewed", e.Start.Add(e.StoreTook), "")
		return
	case engine.EventLeaseLost:
		et := storeErrorType(e.Err)
		o.losses.Add(ctx, 1, o.ops.get(opSet{"", et}, func() []attribute.KeyValue {
			return append(o.attrs(1), errorKey.String(et))
		}))
		o.leaseEvent(ctx, "idempotency.lease.lost", e.Start, et)
		return
	}
	if e.Acquired {
		o.active.Add(ctx, -1, o.common)
	}
	s := steps(e)

	attrs := func() []attribute.KeyValue {
		a := append(o.attrs(3), outcomeKey.String(e.Kind.String()))
		if o.cfg.grpc {
			if answered(e) {
				name := grpcCodeName(e.Status)
				a = append(a, rpcStatusKey.String(name))
				if grpcServerError(e.Status) {
					a = append(a, errorKey.String(name))
				}
			}
			return a
		}
		if e.Status != 0 {
			a = append(a, statusKey.Int(e.Status))
		}
		if et := statusErrorType(e.Status, false); et != "" {
			a = append(a, errorKey.String(et))
		}
		return a
	}
	outcome := o.outcomes.get(outcomeSet{e.Kind, e.Status}, attrs)
	o.requests.Add(ctx, 1, outcome)
	if s.claimed {
		o.recordStore(ctx, "claim", e.ClaimTook, s.claimErr)
	}
	if s.handled {
		o.handler.Record(ctx, e.HandlerTook.Seconds(), outcome)
	}
	if s.write != "" {
		o.recordStore(ctx, s.write, e.StoreTook, s.writeErr)
	}
	o.span(ctx, e, s, attrs)
}

func (o *serverObserver) attrs(extra int) []attribute.KeyValue {
	a := make([]attribute.KeyValue, len(o.cfg.attrs), len(o.cfg.attrs)+extra)
	copy(a, o.cfg.attrs)
	return a
}

func (o *serverObserver) recordStore(ctx context.Context, op string, d time.Duration, errType string) {
	o.store.Record(ctx, d.Seconds(), o.ops.get(opSet{op, errType}, func() []attribute.KeyValue {
		a := append(o.attrs(2), storeOperationKey.String(op))
		if errType != "" {
			a = append(a, errorKey.String(errType))
		}
		return a
	}))
}

// leaseEvent adds an event to the span in ctx, the request's (otelhttp's,
// for example), which is still running.
func (o *serverObserver) leaseEvent(ctx context.Context, name string, at time.Time, errType string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	opts := []trace.EventOption{trace.WithTimestamp(at)}
	if errType != "" {
		opts = append(opts, trace.WithAttributes(errorKey.String(errType)))
	}
	span.AddEvent(name, opts...)
}

// stepsOf is what the middleware did for a request, as far as its final
// event tells.
type stepsOf struct {
	claimed  bool   // a Claim was made
	claimErr string // its error.type, if it failed
	handled  bool   // the handler ran, or began to
	write    string // the store operation after the handler: complete, release or ""
	writeErr string // its error.type, if it failed
}

func steps(e engine.Event) stepsOf {
	var s stepsOf
	switch e.Kind {
	case engine.EventRejected:
		return s
	case engine.EventUnprotected:
		// Without a key nothing was claimed; with Config.FailOpen the Claim
		// failed with Err.
		if e.Err == nil {
			return s
		}
	}
	s.claimed = true
	if !e.Acquired {
		switch e.Kind {
		case engine.EventUnavailable, engine.EventUnprotected, engine.EventClientGone:
			if e.Err != nil {
				s.claimErr = storeErrorType(e.Err)
			}
		}
		return s
	}
	switch e.Kind {
	case engine.EventClientGone:
		// Acquired as the client left: released before the handler.
		s.write = "release"
	case engine.EventExecuted:
		s.handled, s.write = true, "complete"
	case engine.EventNotStored:
		s.handled, s.write, s.writeErr = true, "complete", storeErrorType(e.Err)
	case engine.EventReleased:
		s.handled, s.write = true, "release"
	case engine.EventUnavailable:
		s.handled = true
		if errors.Is(e.Err, engine.ErrNotCommitted) {
			s.write, s.writeErr = "complete", errNotCommitted
		} else {
			// The handler gave up without an answer as its lease ended.
			s.write = "release"
		}
	}
	return s
}

// span records the request as a span, child of the one in ctx, with the
// claim, the handler and the store write as children, after the fact:
// their times come from the event.
func (o *serverObserver) span(ctx context.Context, e engine.Event, s stepsOf, attrs func() []attribute.KeyValue) {
	end := time.Now()
	ctx, span := o.tracer.Start(ctx, "idempotency.request",
		trace.WithTimestamp(e.Start), trace.WithSpanKind(trace.SpanKindInternal))
	if !span.IsRecording() {
		span.End(trace.WithTimestamp(end))
		return
	}
	span.SetAttributes(attrs()...)
	at := e.Start
	child := func(name string, d time.Duration, errType string) {
		_, c := o.tracer.Start(ctx, name, trace.WithTimestamp(at), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(o.cfg.attrs...))
		if errType != "" {
			c.SetAttributes(errorKey.String(errType))
			c.SetStatus(codes.Error, errType)
		}
		at = at.Add(d)
		c.End(trace.WithTimestamp(at))
	}
	if s.claimed {
		child("idempotency.claim", e.ClaimTook, s.claimErr)
	} else {
		at = at.Add(e.ClaimTook)
	}
	if s.handled {
		child("idempotency.handler", e.HandlerTook, "")
	} else {
		at = at.Add(e.HandlerTook)
	}
	if s.write != "" {
		child("idempotency."+s.write, e.StoreTook, s.writeErr)
	}
	switch {
	case e.Kind == engine.EventUnavailable || e.Kind == engine.EventNotStored:
		span.SetStatus(codes.Error, e.Kind.String())
	case o.cfg.grpc:
		if answered(e) && grpcServerError(e.Status) {
			span.SetStatus(codes.Error, "")
		}
	case e.Status >= 500:
		span.SetStatus(codes.Error, "")
	}
	if at.After(end) {
		end = at
	}
	span.End(trace.WithTimestamp(end))
}
