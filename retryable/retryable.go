// Package retryable makes a github.com/hashicorp/go-retryablehttp client
// safe for POSTs. go-retryablehttp retries any request, POST included,
// without an idempotency key, so that a retry after a lost response can
// place an order twice. [Protect] changes an existing *retryablehttp.Client
// so that:
//
//   - a POST or PATCH gets an idempotency key once, before its first
//     attempt, and sends the same key on every retry. A key that the
//     caller set in the header (under any letter case of its name) or
//     carried in the context with idempotency.ContextWithKey wins. Inside
//     a handler behind the middleware of package server, the key is
//     derived from the handler's incoming key, as the Client derives it
//     (idempotency.ContextWithStep, idempotency.Client.DerivedKey): a version 8
//     UUID, derived with the secret of [WithDerivedKeySecret] if given.
//   - a request is retried only if it is safe to repeat: its method is
//     idempotent (GET, HEAD, PUT, DELETE, OPTIONS, TRACE) or it has a key.
//   - what is retried is decided as the Client of package idempotency
//     decides: idempotency.DefaultPolicy for errors and statuses (a 409
//     only when it is the in-flight answer), the server's final answers
//     never (idempotency.ErrOutcomeUnknown, idempotency.ErrKeyMismatch),
//     Stripe-Should-Retry and X-Should-Retry followed on an error status, Retry-After honoured
//     on any status, up to the client's RetryWaitMax, and otherwise
//     exponential backoff with full jitter between 0 and
//     min(RetryWaitMax, RetryWaitMin·2ⁿ).
//
// It speaks this library's own rules only: the key goes in the
// Idempotency-Key header, and the answers are read as this library's server
// writes them. For an API with rules of its own (another key header, as
// PayPal's or Azure's; see package vendors), use the Client of package
// idempotency with WithDialect: a go-retryablehttp client protected here
// would send the key where that API does not look for it.
//
// Everything else stays go-retryablehttp's: RetryMax, the logger, the
// other hooks, and what Do returns when the retries run out. The package
// is named after what it adapts; its name leaves retryablehttp to the
// package it adapts.
package retryable

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/textproto"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/derive"
	"github.com/idemkit/idempotency/internal/hint"
)

// headerKey is the header of the key: the one of this module's own dialect
// (idempotency.Dialect's zero value).
const headerKey = "Idempotency-Key"

// problemBound bounds the reading of a 409's or a 422's problem document,
// as the Client bounds the drain of a body it discards.
const problemBound = 250 * time.Millisecond

// An Option configures Protect.
type Option func(*config)

type config struct {
	secret  []byte
	invalid []error
}

// WithDerivedKeySecret derives the keys of requests made inside a handler
// with secret as well as the incoming key, as the Client of package
// idempotency does with its own WithDerivedKeySecret, which says when it is
// needed: when incoming keys can be guessed and the downstream service
// must not learn them. It must be the same in every process that runs the
// handler, and have at least 16 bytes; it is copied.
func WithDerivedKeySecret(secret []byte) Option {
	return func(c *config) {
		if len(secret) < derive.MinSecret {
			c.invalid = append(c.invalid, fmt.Errorf("retryable: WithDerivedKeySecret needs at least %d bytes, got %d", derive.MinSecret, len(secret)))
			return
		}
		c.secret = append([]byte(nil), secret...)
	}
}

// Protect makes rc safe for POSTs, as the package documentation describes,
// by setting its CheckRetry, Backoff and RequestLogHook (which still calls
// the hook it had, if any) and giving it an HTTPClient of its own, a copy
// of the one it had (go-cleanhttp's pooled client if none), whose
// Transport marks the errors of requests that must not be retried. Call it
// once, before rc is used; it returns an error for a nil rc, one already
// protected, or invalid options (all of them, joined).
//
// The key is set in the header of the *http.Request that rc sends: for a
// request made with retryablehttp.FromRequest, which is the caller's, the
// Header field is replaced by a copy with the key, as go-retryablehttp
// itself replaces its Body; the caller's header map is not modified.
func Protect(rc *retryablehttp.Client, opts ...Option) error {
	var cfg config
	for i, opt := range opts {
		if opt == nil {
			cfg.invalid = append(cfg.invalid, fmt.Errorf("retryable: option %d is nil", i))
			continue
		}
		opt(&cfg)
	}
	if rc == nil {
		cfg.invalid = append(cfg.invalid, errors.New("retryable: Protect needs a *retryablehttp.Client"))
	}
	if err := errors.Join(cfg.invalid...); err != nil {
		return err
	}
	hc := rc.HTTPClient
	if hc == nil {
		hc = cleanhttp.DefaultPooledClient()
	}
	if _, ok := hc.Transport.(*markingTransport); ok {
		return errors.New("retryable: client already protected")
	}
	copied := *hc
	base := copied.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	copied.Transport = &markingTransport{base: base}
	rc.HTTPClient = &copied

	prev := rc.RequestLogHook
	rc.RequestLogHook = func(l retryablehttp.Logger, req *http.Request, attempt int) {
		if attempt == 0 {
			setKey(req, cfg.secret)
		}
		if prev != nil {
			prev(l, req, attempt)
		}
	}
	rc.CheckRetry = checkRetry
	rc.Backoff = backoff
	return nil
}

// setKey gives req, before its first attempt, the key that it sends on
// every attempt, unless it has one; a derived key is derived with secret.
func setKey(req *http.Request, secret []byte) {
	if hasKey(req.Header) || (req.Method != http.MethodPost && req.Method != http.MethodPatch) {
		return
	}
	key, ok := idempotency.KeyFromContext(req.Context())
	if !ok {
		var s [derive.Size]byte
		if s, ok = derive.ForRequest(req.Context(), req.Method, req.URL, secret); ok {
			key = derive.UUID(s, 8)
		}
	}
	if !ok {
		key = idempotency.NewKey()
	}
	h := req.Header.Clone()
	if h == nil {
		h = make(http.Header, 1)
	}
	h[headerKey] = []string{key}
	req.Header = h
}

// hasKey reports whether h holds a key, under any letter case of the
// header's name.
func hasKey(h http.Header) bool {
	if len(h[headerKey]) > 0 {
		return true
	}
	for name, vs := range h {
		if len(vs) > 0 && textproto.CanonicalMIMEHeaderKey(name) == headerKey {
			return true
		}
	}
	return false
}

// safe reports whether req may be sent again.
func safe(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete,
		http.MethodOptions, http.MethodTrace:
		return true
	}
	return hasKey(req.Header)
}

// markingTransport marks the errors of the attempts that must not be
// retried, for checkRetry, which is not given the request of an attempt
// that got no response.
type markingTransport struct {
	base http.RoundTripper
}

// unsafeError is the error of an attempt of a request that must not be
// sent again.
type unsafeError struct{ err error }

func (e *unsafeError) Error() string { return e.err.Error() }
func (e *unsafeError) Unwrap() error { return e.err }

func (t *markingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil && !safe(req) {
		err = &unsafeError{err}
	}
	return resp, err
}

// CloseIdleConnections passes the call on, as go-retryablehttp makes it
// after a failure, to the Transport the client had.
func (t *markingTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		// As go-retryablehttp's own policy does.
		return false, ctx.Err()
	}
	if err != nil {
		var unsafe *unsafeError
		if errors.As(err, &unsafe) {
			return false, nil
		}
		// With a response too, err is a refused redirect: not retried.
		return idempotency.DefaultPolicy(resp, err), nil
	}
	if resp == nil || (resp.Request != nil && !safe(resp.Request)) {
		return false, nil
	}
	switch hint.Read(resp, problemBound) {
	case hint.OutcomeUnknown, hint.KeyMismatch:
		return false, nil
	}
	if allow, ok := hint.ShouldRetry(resp.Header); ok && resp.StatusCode >= 400 {
		// Only an error status: no hint makes a success retried.
		return allow, nil
	}
	return idempotency.DefaultPolicy(resp, nil), nil
}

func backoff(least, most time.Duration, attempt int, resp *http.Response) time.Duration {
	if resp != nil {
		if d, ok := hint.RetryAfter(resp.Header, time.Now(), most); ok {
			return d
		}
	}
	if least <= 0 || most <= 0 || attempt < 0 {
		return 0
	}
	ceiling := most
	if attempt < 63 && least <= most>>attempt {
		ceiling = least << attempt
	}
	k := int64(ceiling)
	if k < math.MaxInt64 {
		k++
	}
	return time.Duration(rand.Int64N(k))
}
