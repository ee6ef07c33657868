package idempotency

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math"
	"net/http"
	"strings"
	"time"
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
// http.Client's Timeout), and the statuses 408 Request Timeout, 409 Conflict
// (the server is still processing an earlier attempt with the same key), 425
// Too Early, 429 Too Many Requests, 500 Internal Server Error, 502 Bad
// Gateway, 503 Service Unavailable and 504 Gateway Timeout.
//
// It does not retry errors that another attempt would repeat: TLS
// certificate errors, a TLS handshake with something that does not speak
// TLS, redirects refused by the redirect policy (ErrRedirect), invalid URLs
// (ErrInvalidURL) and unreplayable bodies (ErrBodyNotReplayable); nor any
// other status, such as 422 Unprocessable Content (the key was reused with a
// different request), the other 4xx, 501 Not Implemented or 505 HTTP
// Version Not Supported.
func DefaultPolicy(resp *http.Response, err error) bool {
	if err != nil {
		return resp == nil && !permanent(err)
	}
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly,
		http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
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

// RetryInfo describes a retry about to happen; see WithOnRetry.
type RetryInfo struct {
	// Key is the idempotency key, or "" if the request carries none.
	Key string

	// Attempt is the number of the attempt that failed, from 1.
	Attempt int

	// Wait is how long Do waits before the next attempt.
	Wait time.Duration

	// StatusCode is the failed attempt's status, or 0 if it had no response.
	StatusCode int

	// Err is the failed attempt's error, or nil if it had a response.
	Err error

	// Result says what the failed attempt got: a response, a timeout, a
	// transport error.
	Result Result

	// Budget is the number of tokens left in the retry budget once this
	// retry took its cost, or -1 if the Client has no budget.
	Budget int
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

// retryAfter returns the wait asked for by the Retry-After header in h, in
// either form (delta-seconds or HTTP-date), clamped to [0, limit]. A date in
// the past means no wait. It reports false when there is no usable header
// or limit is not positive.
func retryAfter(h http.Header, now time.Time, limit time.Duration) (time.Duration, bool) {
	vs := h["Retry-After"]
	if len(vs) == 0 || limit <= 0 {
		return 0, false
	}
	// Optional whitespace is spaces and tabs (RFC 9110, section 5.6.3).
	v := strings.Trim(vs[0], " \t")
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		// delta-seconds: digits only, as many as there are; past the limit
		// their value no longer matters.
		most := int64(limit / time.Second)
		var secs int64
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			if secs <= most {
				secs = secs*10 + int64(c-'0')
			}
		}
		if secs > most {
			return limit, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), limit), true
}
