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
	for _, v := range md.Get(MetadataReplayed) {
		if v == "true" {
			return true
		}
	}
	return false
}

// ClientOption configures UnaryClientInterceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	protect        func(fullMethod string) bool
	maxAttempts    int
	baseDelay      time.Duration
	maxDelay       time.Duration
	maxRetryInfo   time.Duration
	attemptTimeout time.Duration
	retryCodes     map[codes.Code]bool
	newKey         func() (string, error)
	onCall         func(ctx context.Context, fullMethod string, r Report, err error)
	codec          deterministic
	errs           []error
}

func (c *clientConfig) refuse(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("idemgrpc: "+format, args...))
}

// WithMethods protects only the named methods, in the full form gRPC gives
// interceptors ("/package.Service/Method"). By default every unary method
// is protected. It replaces WithMethodFilter.
func WithMethods(fullMethods ...string) ClientOption {
	set := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		set[m] = true
	}
	return func(c *clientConfig) { c.protect = func(m string) bool { return set[m] } }
}

// WithMethodFilter protects the methods for which fn returns true. It
// replaces WithMethods.
func WithMethodFilter(fn func(fullMethod string) bool) ClientOption {
	return func(c *clientConfig) {
		if fn == nil {
			c.refuse("nil method filter")
			return
		}
		c.protect = fn
	}
}

// WithMaxAttempts sets the largest number of attempts per call, including
// the first: 4 by default. 1 turns the interceptor's retries off (gRPC's
// own retryPolicy, if the service config has one, still carries the key);
// below 1 is an error.
func WithMaxAttempts(n int) ClientOption {
	return func(c *clientConfig) {
		if n < 1 {
			c.refuse("max attempts %d is below 1", n)
			return
		}
		c.maxAttempts = n
	}
}

// WithBackoff sets the exponential backoff with full jitter: before retry n
// (from 0) the interceptor waits a random duration between 0 and
// min(limit, base·2ⁿ), 100ms and 5s by default. A base of 0 means no wait. A
// negative base, or a limit below the base, is an error.
func WithBackoff(base, limit time.Duration) ClientOption {
	return func(c *clientConfig) {
		if base < 0 || limit < base {
			c.refuse("backoff from %v to %v is not a range from 0 or more", base, limit)
			return
		}
		c.baseDelay, c.maxDelay = base, limit
	}
}

// WithMaxRetryInfo sets the longest wait that a server's RetryInfo detail
// (sent with Aborted, the key in flight, and Unavailable, its store failing)
// can ask for: 30s by default; a longer one is cut to d. A d of 0 ignores
// RetryInfo and uses the backoff; a negative d is an error.
func WithMaxRetryInfo(d time.Duration) ClientOption {
	return func(c *clientConfig) {
		if d < 0 {
			c.refuse("max RetryInfo delay %v is negative", d)
			return
		}
		c.maxRetryInfo = d
	}
}

// WithAttemptTimeout bounds each attempt: 0 (none) by default. An attempt
// that runs out of time ends with DeadlineExceeded and is retried while the
// call's own context lasts. A negative d is an error.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return func(c *clientConfig) {
		if d < 0 {
			c.refuse("attempt timeout %v is negative", d)
			return
		}
		c.attemptTimeout = d
	}
}

// WithRetryCodes sets the codes on which the interceptor retries, replacing
// the default Unavailable, DeadlineExceeded and Aborted. A code the server
// stores and replays (InvalidArgument, NotFound, ...) gets the same answer
// on every retry. OK is an error.
func WithRetryCodes(cs ...codes.Code) ClientOption {
	return func(c *clientConfig) {
		m := make(map[codes.Code]bool, len(cs))
		for _, code := range cs {
			if code == codes.OK {
				c.refuse("OK is not a code to retry")
				return
			}
			m[code] = true
		}
		c.retryCodes = m
	}
}

// WithKeyFunc sets the function that makes a call's key: a random UUID
// (idempotency.NewKey) by default. A key already in the call's outgoing
// metadata, or set with idempotency.ContextWithKey, is used instead.
func WithKeyFunc(fn func() (string, error)) ClientOption {
	return func(c *clientConfig) {
		if fn == nil {
			c.refuse("nil key function")
			return
		}
		c.newKey = fn
	}
}

// WithCallObserver sets a function called once per protected call, when it
// returns, with its Report and error. A panic in fn is recovered.
func WithCallObserver(fn func(ctx context.Context, fullMethod string, r Report, err error)) ClientOption {
	return func(c *clientConfig) { c.onCall = fn }
}

// UnaryClientInterceptor returns a client interceptor that makes every call
// of a protected method safe to retry: it gives the call an idempotency key
// (a new UUID, unless the caller put one in the outgoing metadata under
// idempotency-key or with idempotency.ContextWithKey), sends it with every
// attempt, and retries the codes of WithRetryCodes with backoff, honouring
// the server's RetryInfo. Every attempt of a call carries the same key, so
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
func UnaryClientInterceptor(opts ...ClientOption) (grpc.UnaryClientInterceptor, error) {
	c := &clientConfig{
		protect:      func(string) bool { return true },
		maxAttempts:  4,
		baseDelay:    100 * time.Millisecond,
		maxDelay:     5 * time.Second,
		maxRetryInfo: 30 * time.Second,
		newKey:       func() (string, error) { return idempotency.NewKey(), nil },
		codec:        newDeterministic(),
	}
	// Unavailable: the connection failed, or the server's store did.
	// DeadlineExceeded: an attempt ran out of time. Aborted: the key is in
	// flight on the server (a handler's own Aborted is released, so it can
	// run again). None of the answers a server stores is among them, nor
	// DataLoss, its "outcome unknown", which must not be retried.
	c.retryCodes = map[codes.Code]bool{codes.Unavailable: true, codes.DeadlineExceeded: true, codes.Aborted: true}
	for _, o := range opts {
		if o == nil {
			c.refuse("nil option")
			continue
		}
		o(c)
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
	if c.onCall != nil {
		c.observe(ctx, method, rep, err)
	}
	return err
}

func (c *clientConfig) observe(ctx context.Context, method string, rep Report, err error) {
	defer func() { _ = recover() }() // the observer's panic must not fail the call
	c.onCall(ctx, method, rep, err)
}

func (c *clientConfig) call(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, rep *Report) error {
	key, err := c.key(ctx)
	if err != nil {
		return err
	}
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
		err = c.attempt(ctx, method, req, reply, cc, invoker, opts)
		rep.Replayed = Replayed(header)
		if err == nil || attempt+1 >= c.maxAttempts || ctx.Err() != nil {
			return err
		}
		st, _ := status.FromError(err)
		if !c.retryCodes[st.Code()] {
			return err
		}
		wait := c.backoff(attempt)
		if d, ok := retryDelay(st); ok && c.maxRetryInfo > 0 {
			wait = min(d, c.maxRetryInfo)
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

func (c *clientConfig) attempt(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	if c.attemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.attemptTimeout)
		defer cancel()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
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
func (c *clientConfig) key(ctx context.Context) (string, error) {
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		if v := md.Get(MetadataKey); len(v) > 0 {
			return v[len(v)-1], nil
		}
	}
	if k, ok := idempotency.KeyFromContext(ctx); ok && k != "" {
		return k, nil
	}
	k, err := c.newKey()
	if err != nil {
		return "", fmt.Errorf("idemgrpc: key: %w", err)
	}
	if k == "" {
		return "", errors.New("idemgrpc: key: the key function returned an empty key")
	}
	return k, nil
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
