package idemotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idempotency"
)

// attemptBuckets are the bounds of the histogram of attempts per operation.
var attemptBuckets = []float64{1, 2, 3, 4, 5, 6, 8, 10}

// clientObserver turns a Client's events into metrics and spans.
type clientObserver struct {
	cfg    config
	tracer trace.Tracer

	attempts   metric.Int64Counter
	attemptDur metric.Float64Histogram
	retries    metric.Int64Counter
	operations metric.Int64Counter
	opAttempts metric.Int64Histogram
	opDur      metric.Float64Histogram
	budget     metric.Int64Gauge

	common     metric.MeasurementOption // the attributes of WithAttributes
	attemptSet setCache[attemptKey]
	opSet      setCache[operationKey]

	// The spans of the operations that are retrying, until their final
	// event.
	mu    sync.Mutex
	spans map[callID]callSpan
}

type attemptKey struct {
	method  string
	status  int
	errType string
	retry   bool // for the retries: without the status
}

type operationKey struct {
	method  string
	kind    idempotency.EventKind
	status  int
	errType string
	stop    string
}

// callID tells the calls of several Clients apart: a Client numbers its
// own calls.
type callID struct {
	call  uint64
	start int64
}

type callSpan struct {
	ctx  context.Context
	span trace.Span
}

// ClientObserver returns an observer for a Client (idempotency.WithObserver)
// that records each attempt and operation as metrics and spans; the package
// documentation and the README list them. One observer may serve several
// Clients. It fails on an invalid option, or if an instrument
// cannot be made.
func ClientObserver(opts ...Option) (idempotency.Observer, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := cfg.meter()
	o := &clientObserver{cfg: cfg, tracer: cfg.tracer(), spans: make(map[callID]callSpan),
		common: metric.WithAttributes(cfg.attrs...)}
	var e error
	o.attempts, e = m.Int64Counter("idempotency.client.attempts",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts sent, by their result."))
	err = errors.Join(err, e)
	o.attemptDur, e = m.Float64Histogram("idempotency.client.attempt.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of an attempt, to its response headers or its error."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	o.retries, e = m.Int64Counter("idempotency.client.retries",
		metric.WithUnit("{retry}"),
		metric.WithDescription("Retries, by the result that caused them."))
	err = errors.Join(err, e)
	o.operations, e = m.Int64Counter("idempotency.client.operations",
		metric.WithUnit("{operation}"),
		metric.WithDescription("Operations (calls to Do), by how they ended."))
	err = errors.Join(err, e)
	o.opAttempts, e = m.Int64Histogram("idempotency.client.operation.attempts",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts made per operation."),
		metric.WithExplicitBucketBoundaries(attemptBuckets...))
	err = errors.Join(err, e)
	o.opDur, e = m.Float64Histogram("idempotency.client.operation.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of an operation, every attempt and wait included."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	o.budget, e = m.Int64Gauge("idempotency.client.retry_budget.available",
		metric.WithUnit("{token}"),
		metric.WithDescription("Tokens left in the client's retry budget."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return o.observe, nil
}

func (o *clientObserver) observe(ctx context.Context, e idempotency.Event) {
	errType := attemptErrorType(e)
	final := e.Kind != idempotency.EventRetried

	if !e.Sent.IsZero() {
		attrs := o.attemptSet.get(attemptKey{e.Method, e.StatusCode, errType, false}, func() []attribute.KeyValue {
			a := append(o.attrs(3), methodKey.String(e.Method))
			if e.StatusCode != 0 {
				a = append(a, statusKey.Int(e.StatusCode))
			}
			if errType != "" {
				a = append(a, errorKey.String(errType))
			}
			return a
		})
		o.attempts.Add(ctx, 1, attrs)
		o.attemptDur.Record(ctx, e.Took.Seconds(), attrs)
	}
	if !final {
		o.retries.Add(ctx, 1, o.attemptSet.get(attemptKey{e.Method, 0, errType, true}, func() []attribute.KeyValue {
			return append(o.attrs(2), methodKey.String(e.Method), errorKey.String(errType))
		}))
	}
	if e.Budget >= 0 {
		o.budget.Record(ctx, int64(e.Budget), o.common)
	}

	var opAttrs func() []attribute.KeyValue
	if final {
		var stop string
		if e.Kind == idempotency.EventGaveUp {
			stop = stopReason(e.Stopped)
		}
		opAttrs = func() []attribute.KeyValue {
			a := append(o.attrs(5), methodKey.String(e.Method), outcomeKey.String(e.Kind.String()))
			if stop != "" {
				a = append(a, stopReasonKey.String(stop))
			}
			if e.StatusCode != 0 {
				a = append(a, statusKey.Int(e.StatusCode))
			}
			if errType != "" {
				a = append(a, errorKey.String(errType))
			}
			return a
		}
		attrs := o.opSet.get(operationKey{e.Method, e.Kind, e.StatusCode, errType, stop}, opAttrs)
		o.operations.Add(ctx, 1, attrs)
		o.opAttempts.Record(ctx, int64(e.Attempt), attrs)
		o.opDur.Record(ctx, e.Elapsed.Seconds(), attrs)
	}
	o.span(ctx, e, errType, opAttrs)
}

func (o *clientObserver) attrs(extra int) []attribute.KeyValue {
	a := make([]attribute.KeyValue, len(o.cfg.attrs), len(o.cfg.attrs)+extra)
	copy(a, o.cfg.attrs)
	return a
}

// attemptErrorType is error.type for an attempt: its status when it is an
// error, as the HTTP semantic conventions say, or what it got instead of a
// response.
func attemptErrorType(e idempotency.Event) string {
	if e.Result == idempotency.ResultResponse {
		return statusErrorType(e.StatusCode, true)
	}
	return e.Result.String()
}

// span records the operation as a span, child of the one in ctx, begun at
// its first event and ended at its last, with a child span for each
// attempt. The times come from the events.
func (o *clientObserver) span(ctx context.Context, e idempotency.Event, errType string, opAttrs func() []attribute.KeyValue) {
	id := callID{call: e.Call, start: e.Start.UnixNano()}
	final := e.Kind != idempotency.EventRetried
	o.mu.Lock()
	cs, ok := o.spans[id]
	if ok && final {
		delete(o.spans, id)
	}
	o.mu.Unlock()
	if !ok {
		attrs := append(o.attrs(2), methodKey.String(e.Method))
		cs.ctx, cs.span = o.tracer.Start(ctx, "idempotency.operation",
			trace.WithTimestamp(e.Start), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
		if !final {
			// Kept until the final event, sampled or not, so that every
			// event of the call follows one decision.
			o.mu.Lock()
			o.spans[id] = cs
			o.mu.Unlock()
		}
	}
	recording := cs.span.IsRecording()
	if recording && !e.Sent.IsZero() {
		o.attemptSpan(cs.ctx, e, errType)
	}
	if !final {
		return
	}
	if recording {
		cs.span.SetAttributes(opAttrs()...)
		cs.span.SetAttributes(attemptsKey.Int(e.Attempt), replayedKey.Bool(e.Replayed))
		switch e.Kind {
		case idempotency.EventGaveUp, idempotency.EventFailed:
			cs.span.SetStatus(codes.Error, e.Kind.String())
		}
	}
	cs.span.End(trace.WithTimestamp(e.Start.Add(e.Elapsed)))
}

func (o *clientObserver) attemptSpan(ctx context.Context, e idempotency.Event, errType string) {
	attrs := append(o.attrs(5), methodKey.String(e.Method))
	if e.Attempt > 1 {
		attrs = append(attrs, resendKey.Int(e.Attempt-1))
	}
	if e.StatusCode != 0 {
		attrs = append(attrs, statusKey.Int(e.StatusCode))
	}
	if errType != "" {
		attrs = append(attrs, errorKey.String(errType))
	}
	if e.Kind == idempotency.EventRetried {
		attrs = append(attrs, waitKey.Float64(e.Wait.Seconds()))
	}
	_, span := o.tracer.Start(ctx, "idempotency.attempt",
		trace.WithTimestamp(e.Sent), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	if errType != "" {
		span.SetStatus(codes.Error, errType)
	}
	span.End(trace.WithTimestamp(e.Sent.Add(e.Took)))
}
