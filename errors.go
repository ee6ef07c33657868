package idempotency

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Errors for bad input, returned by Do before any attempt is made. The
// returned error wraps one of them, with the package's prefix, and says what
// is wrong: "idempotency: invalid key: ...".
var (
	// ErrInvalidURL is returned for a request whose URL is missing, relative,
	// not http or https, or has no host. It is also the error of an attempt
	// redirected to such a URL, which is never retried.
	ErrInvalidURL = errors.New("invalid request URL")

	// ErrInvalidKey is returned for a key that the caller supplied (in the
	// header or through ContextWithKey) or that a key function made, when it is not
	// a valid idempotency key: empty, over 255 bytes, or with characters
	// outside printable ASCII; and for a request header that holds two keys.
	// It wraps the reason.
	ErrInvalidKey = errors.New("invalid key")
)

// Errors that describe one attempt.
var (
	// ErrAttemptTimeout matches (with errors.Is) the error of an attempt whose
	// response headers did not arrive within the attempt timeout (see
	// WithAttemptTimeout). Such an attempt is retried.
	ErrAttemptTimeout = errors.New("attempt timed out")

	// ErrRedirect matches the error of an attempt whose redirect was refused
	// by the CheckRedirect policy (the default one stops after 10 redirects).
	// It wraps the policy's error. Such an attempt is not retried.
	ErrRedirect = errors.New("redirect refused")
)

// Reasons why no further attempt was made although the last result was
// retryable. They are reported in Outcome.Stopped and RetryError.Stopped.
var (
	// ErrAttemptsExhausted means that the maximum number of attempts was made
	// (see [WithMaxAttempts]).
	ErrAttemptsExhausted = errors.New("attempts exhausted")

	// ErrNotIdempotent means that the request has a method that is not
	// idempotent (such as POST) and carries no idempotency key, so a retry
	// could perform the operation twice.
	ErrNotIdempotent = errors.New("request is neither idempotent nor keyed")

	// ErrBodyNotReplayable means that the request body cannot be sent again:
	// it was larger than the buffer limit (see [WithMaxBufferedBody]) and the
	// request has no GetBody, or GetBody failed (then it is wrapped too).
	ErrBodyNotReplayable = errors.New("request body cannot be replayed")

	// ErrDeadline means that the wait before the next attempt would have
	// ended after the deadline of the request's context, so the last result
	// was returned at once instead of waiting in vain.
	ErrDeadline = errors.New("next attempt would start after the context deadline")

	// ErrBudgetExhausted means that the retry budget had too few tokens left
	// (see [Budget]).
	ErrBudgetExhausted = errors.New("retry budget exhausted")

	// ErrRetryRefused means that the server said not to retry, with
	// Stripe-Should-Retry: false or X-Should-Retry: false, a response that
	// the retry policy would have retried.
	ErrRetryRefused = errors.New("server says not to retry")
)

// The final answers of a server that honours keys, which are never
// retried, whatever the Policy says. They are reported in Outcome.Stopped
// and Event.Stopped of the response that carries them.
var (
	// ErrOutcomeUnknown means that the server answered "outcome unknown"
	// (409, without Retry-After, with the problem type or code of package
	// server's at-most-once policy): an earlier attempt with this key was
	// abandoned by the server while it ran, so its effect may or may not
	// have happened, and the server will not run the request again. Find
	// out from the service, or have an operator resolve the key.
	ErrOutcomeUnknown = errors.New("server says the outcome of the key is unknown")

	// ErrKeyMismatch means that the server answered that the key was used
	// before with a different request (422, with the problem type or code
	// of package server): another attempt would get the same answer.
	ErrKeyMismatch = errors.New("server says the key was used for another request")
)

// RetryError is the error returned by Do when there is no response to
// return: every attempt failed without one, or the caller's context ended,
// or the last attempt's error is not retryable. When an attempt did produce a
// response, Do returns that response and a nil error instead, as net/http
// does: a status is not an error.
//
// RetryError unwraps to both Err and Stopped, so errors.Is and errors.As
// find the last attempt's error (for example context.Canceled or an
// *url.Error) as well as the reason retrying stopped (for example
// ErrBudgetExhausted).
type RetryError struct {
	// Key is the idempotency key sent on every attempt, or "" if the
	// request carried none.
	Key string

	// Attempts is the number of attempts made.
	Attempts int

	// Err is the last attempt's error, or the context's error when the
	// context ended while waiting for the next attempt. From Do it is
	// usually an *url.Error, as http.Client.Do returns.
	Err error

	// Stopped is why no further attempt was made although Err was
	// retryable (one of ErrAttemptsExhausted, ErrNotIdempotent,
	// ErrBodyNotReplayable, ErrDeadline, ErrBudgetExhausted), or nil. (The
	// server's final answers, ErrOutcomeUnknown and ErrKeyMismatch, come
	// with a response, so Do returns it and they are in its Outcome.)
	Stopped error
}

// Error reports the attempts, the key, the stop reason and the last error.
func (e *RetryError) Error() string {
	var b strings.Builder
	b.WriteString("idempotency: ")
	b.WriteString(strconv.Itoa(e.Attempts))
	if e.Attempts == 1 {
		b.WriteString(" attempt")
	} else {
		b.WriteString(" attempts")
	}
	if e.Key != "" {
		b.WriteString(" with key ")
		b.WriteString(strconv.Quote(e.Key))
	}
	if e.Stopped != nil {
		b.WriteString(", then ")
		b.WriteString(e.Stopped.Error())
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns Err and Stopped, leaving out those that are nil.
func (e *RetryError) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.Stopped != nil {
		errs = append(errs, e.Stopped)
	}
	return errs
}

// attemptTimeoutError is the error of an attempt cut short by the attempt
// timeout. It reports itself as a timeout, as net errors do, so that
// url.Error.Timeout is true, but it does not match context.Canceled: the
// caller did not cancel anything.
type attemptTimeoutError struct {
	d time.Duration
}

func (e *attemptTimeoutError) Error() string {
	return "idempotency: attempt timed out after " + e.d.String() + " awaiting response headers"
}

func (e *attemptTimeoutError) Is(target error) bool { return target == ErrAttemptTimeout }
func (e *attemptTimeoutError) Timeout() bool        { return true }
func (e *attemptTimeoutError) Temporary() bool      { return true }
