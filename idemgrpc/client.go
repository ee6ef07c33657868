package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency"
)

// Report is what the client interceptor tells the caller of one call: the
// key it sent, how many attempts it made and whether the answer was a
// replay. Ask for it with the [WithReport] call option.
type Report struct {
	// Key is the idempotency key sent with every attempt; empty for a
	// method the interceptor does not protect.
	Key string
	// Attempts is the number of attempts the interceptor made, 1 or more
	// (gRPC's own retries, under a service config retryPolicy, happen
	// inside one of them and are not counted here).
	Attempts int
	// Replayed reports that the last attempt was answered with a stored
	// answer of an earlier one (the header idempotent-replayed: true).
	Replayed bool
}

// reportOption is the call option WithReport returns.
type reportOption struct {
	grpc.EmptyCallOption
	r *Report
}

// WithReport returns a call option with which the client interceptor fills
// r when the call returns, whatever its outcome:
//
//	var rep idemgrpc.Report
//	resp, err := client.Create(ctx, req, idemgrpc.WithReport(&rep))
//	// rep.Attempts, rep.Replayed, rep.Key
//
// Without the interceptor it does nothing.
func WithReport(r *Report) grpc.CallOption { return reportOption{r: r} }

// Replayed reports whether md, the header metadata of an answer (captured
// with grpc.Header), says that the answer was replayed.
func Replayed(md metadata.MD) bool {
	for _, v := range md.Get(metadataReplayed) {
		if v == "true" {
			return true
		}
	}
	return false
}

type clientConfig struct {
	protect       func(fullMethod string) bool
	maxAttempts   int
	baseDelay     time.Duration
	maxDelay      time.Duration
	maxRetryAfter time.Duration
	retryCodes    map[codes.Code]bool
	codec         deterministic
	errs          []error
}

func (c *clientConfig) refuse(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("idemgrpc: "+format, args...))
}

// UnaryClientInterceptor returns a client interceptor that makes every call
// of a protected method safe to retry: it gives the call an idempotency key
// (a new UUID, unless the caller put one in the outgoing metadata under
// idempotency-key or with idempotency.ContextWithKey), sends it with every
// attempt, and retries Unavailable, DeadlineExceeded and Aborted (and
// Canceled while the caller's own context is live: an attempt cancelled by
// a per-attempt deadline) with backoff, honouring the server's RetryInfo. Every attempt of a call carries the same key, so
// a server protected by [Server] runs the call at most once. gRPC's own
// retries (a retryPolicy in the service config) happen below the
// interceptor, with the metadata it set, so they carry the key too.
//
// Every attempt sends the same bytes, of which the server makes the call's
// fingerprint: the interceptor marshals the request deterministically with
// protobuf (grpc.ForceCodecV2 and the content-subtype "proto"), since
// proto.Marshal writes a map's entries in a random order. A call given its
// own codec or content-subtype as a call option keeps it; one given by
// grpc.WithDefaultCallOptions is replaced.
//
// It returns an error naming every invalid option.
func UnaryClientInterceptor(opts ...Option) (grpc.UnaryClientInterceptor, error) {
	c := &clientConfig{
		protect:       func(string) bool { return true },
		maxAttempts:   4,
		baseDelay:     100 * time.Millisecond,
		maxDelay:      5 * time.Second,
		maxRetryAfter: 30 * time.Second,
		codec:         newDeterministic(),
	}
	// Unavailable: the connection failed, or the server's store did.
	// DeadlineExceeded: an attempt ran out of time. Aborted: the key is in
	// flight on the server (a handler's own Aborted is released, so it can
	// run again). None of the answers a server stores is among them, nor
	// DataLoss, its "outcome unknown", which must not be retried.
	c.retryCodes = map[codes.Code]bool{codes.Unavailable: true, codes.DeadlineExceeded: true, codes.Aborted: true}
	o := &options{cli: c}
	for i, opt := range opts {
		if opt == nil {
			c.refuse("option %d is nil", i)
			continue
		}
		opt(o)
	}
	if len(c.errs) > 0 {
		return nil, errors.Join(c.errs...)
	}
	return c.intercept, nil
}

func (c *clientConfig) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var report *Report
	for _, o := range opts {
		if r, ok := o.(reportOption); ok && r.r != nil {
			report = r.r
		}
	}
	if !c.protect(method) {
		if report != nil {
			*report = Report{Attempts: 1}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	var rep Report
	err := c.call(ctx, method, req, reply, cc, invoker, opts, &rep)
	if report != nil {
		*report = rep
	}
	return err
}

func (c *clientConfig) call(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, rep *Report) error {
	key := c.key(ctx)
	rep.Key = key
	if key != "" && !hasKey(ctx) {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	var header metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&header))
	if !choosesCodec(opts) {
		// Every attempt sends the same bytes, of which the server makes
		// the call's fingerprint: marshalled deterministically, since
		// proto.Marshal writes a map's entries in a random order. The
		// caller's own codec or content-subtype, given with the call,
		// comes after these and wins.
		opts = append([]grpc.CallOption{grpc.ForceCodecV2(c.codec), grpc.CallContentSubtype(c.codec.Name())}, opts...)
	}
	for attempt := 0; ; attempt++ {
		header = nil
		rep.Attempts = attempt + 1
		err := invoker(ctx, method, req, reply, cc, opts...)
		rep.Replayed = Replayed(header)
		if err == nil || attempt+1 >= c.maxAttempts || ctx.Err() != nil {
			return err
		}
		st, _ := status.FromError(err)
		// Canceled while the caller's context is live: the attempt was
		// cancelled by something else (a per-attempt deadline chained
		// after this interceptor, whose cancellation the server may see
		// first and answer), and with a key it is safe to send again.
		if !c.retryCodes[st.Code()] && (st.Code() != codes.Canceled || key == "") {
			return err
		}
		wait := c.backoff(attempt)
		if d, ok := retryDelay(st); ok && c.maxRetryAfter > 0 {
			wait = min(d, c.maxRetryAfter)
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

// backoff returns the wait before retry n (from 0): full jitter up to
// min(maxDelay, baseDelay·2ⁿ).
func (c *clientConfig) backoff(n int) time.Duration {
	if c.baseDelay <= 0 {
		return 0
	}
	limit := c.maxDelay
	if n < 62 {
		if d := c.baseDelay << n; d > 0 && d < limit {
			limit = d
		}
	}
	if limit <= 0 {
		return 0
	}
	return rand.N(limit) // [0, limit): limit+1 could overflow
}

// key returns the call's key: the one in the outgoing metadata, the one of
// idempotency.ContextWithKey, or a new one.
func (c *clientConfig) key(ctx context.Context) string {
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		if v := md.Get(MetadataKey); len(v) > 0 {
			return v[len(v)-1]
		}
	}
	if k, ok := idempotency.KeyFromContext(ctx); ok && k != "" {
		return k
	}
	return idempotency.NewKey()
}

// choosesCodec reports whether opts choose the call's codec or
// content-subtype.
func choosesCodec(opts []grpc.CallOption) bool {
	for _, o := range opts {
		switch o.(type) {
		case grpc.ForceCodecV2CallOption, grpc.ForceCodecCallOption, grpc.ContentSubtypeCallOption:
			return true
		}
	}
	return false
}

func hasKey(ctx context.Context) bool {
	md, ok := metadata.FromOutgoingContext(ctx)
	return ok && len(md.Get(MetadataKey)) > 0
}
