package idempotency

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/idemkit/idempotency/internal/hint"
)

// Policy decides whether the result of one attempt is worth retrying: resp
// is the response (nil if the attempt failed) and err the attempt's error
// (nil if there is a response). It must decide from the error, the status
// and the headers only: it must not read or close resp.Body, which is either
// returned to the caller or drained and closed by Do.
//
// A Policy is only asked whether a result is transient. It cannot make Do
// retry a request that is unsafe or impossible to retry: the caller's own
// cancellation or deadline, a request that is neither idempotent nor keyed,
// a body that cannot be replayed, and the limits on attempts, waiting and
// budget are all checked by Do, whatever the Policy says.
type Policy func(resp *http.Response, err error) bool

// DefaultPolicy is the Policy a Client uses unless WithRetryPolicy replaces
// it.
//
// It retries transport errors, such as a refused or reset connection, an
// unexpected EOF from a server that closed the connection without
// answering, or a timeout (including ErrAttemptTimeout and the
// http.Client's Timeout), and the statuses 408 Request Timeout, 425 Too
// Early, 429 Too Many Requests, 500 Internal Server Error, 502 Bad Gateway,
// 503 Service Unavailable and 504 Gateway Timeout.
//
// It retries a 409 Conflict only when it is the answer that a request with
// the same key is still being processed: a 409 whose problem document
// (which Do reads, up to 4 KiB, and leaves for the caller) has this
// module's in-flight type or code, or the in-flight title of the IETF
// draft's examples, or a 409 with Retry-After; never one that says
// "outcome unknown". A Dialect's Answer marks the in-flight answers of
// other APIs, which are retried whatever the Policy says.
// Any other 409 is a business conflict ("email already registered"),
// which another attempt would only repeat. To retry every 409, widen it:
//
//	func(resp *http.Response, err error) bool {
//		return resp != nil && resp.StatusCode == http.StatusConflict || idempotency.DefaultPolicy(resp, err)
//	}
//
// It does not retry errors that another attempt would repeat: TLS
// certificate errors, a TLS handshake with something that does not speak
// TLS, redirects refused by the redirect policy (ErrRedirect), invalid URLs
// (ErrInvalidURL) and unreplayable bodies (ErrBodyNotReplayable); nor any
// other status, such as 422 Unprocessable Content (the key was reused with a
// different request), the other 4xx, 501 Not Implemented or 505 HTTP
// Version Not Supported.
//
// Whatever the policy, Do never retries the final answers of the
// middleware (ErrOutcomeUnknown, ErrKeyMismatch) nor a response marked as
// a replay, which another attempt with the key would get again, and it
// follows the retry
// hint of a server that sends Stripe-Should-Retry or X-Should-Retry with an
// error status (4xx, 5xx): "false" stops (ErrRetryRefused), "true"
// retries, within the same limits of methods, attempts, deadline and
// budget; "false" wins over "true".
func DefaultPolicy(resp *http.Response, err error) bool {
	if err != nil {
		return resp == nil && !permanent(err)
	}
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusTooEarly,
		http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return inFlight(resp)
	}
	return false
}

// inFlight reports whether resp is a server's answer that a request with
// the same key is still being processed, so that a retry after a while is
// safe and may get the response: a 409 Conflict with Retry-After, or whose
// problem document (which Do reads, up to 4 KiB, before it asks the Policy,
// and leaves for the caller to read) has the type or the code of this
// module's in-flight answer, or the title of the IETF draft's in-flight
// example. A 409 that says "outcome unknown" is final, never in flight.
func inFlight(resp *http.Response) bool {
	if resp == nil || resp.StatusCode != http.StatusConflict {
		return false
	}
	switch hint.Of(resp) {
	case hint.InFlight:
		return true
	case hint.OutcomeUnknown:
		return false
	}
	return len(resp.Header["Retry-After"]) > 0
}

var _ Policy = DefaultPolicy

// permanent reports whether err is an error that a new attempt would meet
// again.
func permanent(err error) bool {
	if errors.Is(err, ErrRedirect) || errors.Is(err, ErrInvalidURL) || errors.Is(err, ErrBodyNotReplayable) {
		return true
	}
	var (
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &authority) ||
		errors.As(err, &hostname) || errors.As(err, &invalid)
}

// isTimeout reports whether an attempt's error is a timeout, which makes a
// retry cost more of the budget.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// idempotent reports whether method is idempotent by HTTP semantics (RFC
// 9110, section 9.2.2), so that repeating it is safe without a key.
func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete,
		http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// backoff returns the wait before retry number n (from 0): a random
// duration in [0, min(limit, base·2ⁿ)], "full jitter", so that clients that
// failed together do not retry together. rnd(k) returns a number in [0, k).
func backoff(n int, base, limit time.Duration, rnd func(int64) int64) time.Duration {
	if base <= 0 || limit <= 0 || n < 0 {
		return 0
	}
	ceiling := limit
	if n < 63 && base <= limit>>n {
		ceiling = base << n
	}
	k := int64(ceiling)
	if k < math.MaxInt64 {
		k++
	}
	return time.Duration(rnd(k))
}

// retryAfter returns the wait asked for by the Retry-After header in h; see
// hint.RetryAfter.
func retryAfter(h http.Header, now time.Time, limit time.Duration) (time.Duration, bool) {
	return hint.RetryAfter(h, now, limit)
}

// answerKind is what the problem document of a response says about its key.
type answerKind = hint.Answer

// readAnswer reads the problem document of a 409 or a 422 response, within
// bound, and leaves its body whole for the caller.
func readAnswer(resp *http.Response, bound time.Duration) answerKind {
	return hint.Read(resp, bound)
}

// finalAnswer returns the error that says which final answer a is, or nil
// if a is not final.
func finalAnswer(a answerKind) error {
	switch a {
	case hint.OutcomeUnknown:
		return ErrOutcomeUnknown
	case hint.KeyMismatch:
		return ErrKeyMismatch
	}
	return nil
}

// shouldRetryHint returns what a server's retry hint headers say.
func shouldRetryHint(h http.Header) (allow, ok bool) {
	return hint.ShouldRetry(h)
}
