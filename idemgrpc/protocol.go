package idemgrpc

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// MetadataKey is the request metadata that carries the idempotency key, in
// the lower case gRPC uses.
const MetadataKey = "idempotency-key"

// The other metadata of the protocol.
const (
	// metadataReplayed is the response header with which the server says
	// that it did not run the call again but replayed the stored answer of
	// an earlier one with the same key. Its value is "true".
	metadataReplayed = "idempotent-replayed"
	// metadataRetryAfter is the response trailer, in whole seconds, sent
	// with Aborted (the key in flight) and Unavailable (the store failing),
	// for clients that do not read the RetryInfo detail.
	metadataRetryAfter = "retry-after"
)

// errorDomain is the domain of the google.rpc.ErrorInfo detail that the
// server attaches to the answers it makes itself; its Reason is one of the
// reasons below, listed in the package documentation.
const errorDomain = "idempotency.idemkit.github.com"

// Reasons, in the ErrorInfo detail of the server's own answers.
const (
	reasonKeyMissing       = "KEY_MISSING"           // InvalidArgument
	reasonKeyInvalid       = "KEY_INVALID"           // InvalidArgument
	reasonUnidentified     = "REQUEST_UNIDENTIFIED"  // InvalidArgument
	reasonInFlight         = "IN_FLIGHT"             // Aborted, with RetryInfo
	reasonKeyMismatch      = "KEY_MISMATCH"          // FailedPrecondition
	reasonStoreUnavailable = "STORE_UNAVAILABLE"     // Unavailable, with RetryInfo
	reasonOutcomeUnknown   = "OUTCOME_UNKNOWN"       // DataLoss
	reasonResponseOmitted  = "RESPONSE_OMITTED"      // DataLoss
	reasonStreaming        = "STREAMING_UNSUPPORTED" // Unimplemented
)

// Reason returns the Reason of the idempotency ErrorInfo detail of err, a
// gRPC status error, such as "IN_FLIGHT" (the package documentation lists
// them all); "" if err has none (it is not
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
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
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
