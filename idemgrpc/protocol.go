package idemgrpc

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// Metadata names of the protocol, in the lower case gRPC uses.
const (
	// MetadataKey is the request metadata that carries the idempotency key.
	MetadataKey = "idempotency-key"
	// MetadataReplayed is the response header with which the server says
	// that it did not run the call again but replayed the stored answer of
	// an earlier one with the same key. Its value is "true".
	MetadataReplayed = "idempotent-replayed"
	// MetadataRetryAfter is the response trailer, in whole seconds, sent
	// with Aborted (the key in flight) and Unavailable (the store failing),
	// for clients that do not read the RetryInfo detail.
	MetadataRetryAfter = "retry-after"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that the
// server attaches to the answers it makes itself; its Reason is one of the
// Reason... constants.
const ErrorDomain = "idempotency.idemkit.github.com"

// Reasons, in the ErrorInfo detail of the server's own answers.
const (
	ReasonKeyMissing       = "KEY_MISSING"           // InvalidArgument
	ReasonKeyInvalid       = "KEY_INVALID"           // InvalidArgument
	ReasonUnidentified     = "REQUEST_UNIDENTIFIED"  // InvalidArgument
	ReasonInFlight         = "IN_FLIGHT"             // Aborted, with RetryInfo
	ReasonKeyMismatch      = "KEY_MISMATCH"          // FailedPrecondition
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"     // Unavailable, with RetryInfo
	ReasonOutcomeUnknown   = "OUTCOME_UNKNOWN"       // DataLoss
	ReasonResponseOmitted  = "RESPONSE_OMITTED"      // DataLoss
	ReasonStreaming        = "STREAMING_UNSUPPORTED" // Unimplemented
)

// Reason returns the Reason of the idempotency ErrorInfo detail of err, a
// gRPC status error, such as ReasonInFlight; "" if err has none (it is not
// an answer the server's interceptor made itself).
func Reason(err error) string {
	if err == nil {
		return ""
	}
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// retryDelay returns the delay of st's RetryInfo detail, if it has one.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
