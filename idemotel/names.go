package idemotel

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
)

// Attributes of this package's own, under the idempotency namespace. The
// others are OpenTelemetry's semantic conventions for HTTP:
// http.request.method, http.response.status_code, http.request.resend_count
// and error.type.
const (
	// outcomeKey is what the middleware or the client did: the name of a
	// [engine.EventKind] or an [idempotency.EventKind].
	outcomeKey = attribute.Key("idempotency.outcome")
	// storeOperationKey names a Store operation: claim, complete, release,
	// extend.
	storeOperationKey = attribute.Key("idempotency.store.operation")
	// stopReasonKey is why a client stopped retrying: attempts_exhausted,
	// budget_exhausted, deadline, not_idempotent, body_not_replayable,
	// retry_refused; or the server's final answer: outcome_unknown,
	// key_mismatch.
	stopReasonKey = attribute.Key("idempotency.stop_reason")
	// attemptsKey is the number of attempts of a client's operation, on its
	// span.
	attemptsKey = attribute.Key("idempotency.attempts")
	// replayedKey reports, on a client's spans, that the response was a
	// replay.
	replayedKey = attribute.Key("idempotency.replayed")
	// waitKey is, on a retried attempt's span, the wait before the next
	// attempt, in seconds.
	waitKey = attribute.Key("idempotency.retry.wait")
)

// Values of error.type of this package's own; the rest are status codes, as
// the HTTP semantic conventions have them.
const (
	errTimeout      = "timeout"
	errLeaseLost    = "lease_lost"
	errNotCommitted = "not_committed"
	errOther        = "_OTHER"
)

// storeErrorType is error.type for a Store's error: few values, never the
// error's text, which may name a key.
func storeErrorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return errTimeout
	case errors.Is(err, engine.ErrLeaseLost):
		return errLeaseLost
	case errors.Is(err, engine.ErrNotCommitted):
		return errNotCommitted
	}
	return errOther
}

// statusErrorType is error.type for an HTTP status: the code when it is an
// error, as the semantic conventions say (for a server, 5xx only), or "".
func statusErrorType(status int, client bool) string {
	if status >= 500 || (client && status >= 400) {
		return strconv.Itoa(status)
	}
	return ""
}

// grpcCodes are the names of the gRPC status codes, by number, as
// rpc.response.status_code has them.
var grpcCodes = [...]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED",
}

// grpcCodeName is the name of gRPC status code c, or its number for one
// that has none.
func grpcCodeName(c int) string {
	if c >= 0 && c < len(grpcCodes) {
		return grpcCodes[c]
	}
	return strconv.Itoa(c)
}

// grpcServerError reports whether a server that answered with gRPC code c
// failed, as the gRPC semantic conventions count it.
func grpcServerError(c int) bool {
	switch c {
	case 2, 4, 12, 13, 14, 15: // UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS
		return true
	}
	return false
}

// stopReason names why a client stopped retrying.
func stopReason(err error) string {
	switch {
	case errors.Is(err, idempotency.ErrAttemptsExhausted):
		return "attempts_exhausted"
	case errors.Is(err, idempotency.ErrBudgetExhausted):
		return "budget_exhausted"
	case errors.Is(err, idempotency.ErrDeadline):
		return "deadline"
	case errors.Is(err, idempotency.ErrNotIdempotent):
		return "not_idempotent"
	case errors.Is(err, idempotency.ErrBodyNotReplayable):
		return "body_not_replayable"
	case errors.Is(err, idempotency.ErrRetryRefused):
		return "retry_refused"
	case errors.Is(err, idempotency.ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.Is(err, idempotency.ErrKeyMismatch):
		return "key_mismatch"
	}
	return errOther
}

var (
	methodKey = semconv.HTTPRequestMethodKey
	statusKey = semconv.HTTPResponseStatusCodeKey
	// rpcStatusKey is the status of a gRPC answer (GRPCServerObserver).
	rpcStatusKey = semconv.RPCResponseStatusCodeKey
	errorKey     = semconv.ErrorTypeKey
	resendKey    = semconv.HTTPRequestResendCountKey
)
