// Package wire holds the names of the protocol that the client and the
// server packages both speak: the problem types and codes of the answers the
// middleware writes itself, so that the client recognises them without
// importing the server.
package wire

// ProblemBase is where each problem type is documented: a problem's type is
// ProblemBase followed by the name of the server's sentinel error.
const ProblemBase = "https://pkg.go.dev/github.com/idemkit/idempotency/server#"

// Problem types the client decides on.
const (
	// TypeInFlight is the type of the 409 that says a request with the
	// same key is still being processed: retrying it is safe.
	TypeInFlight = ProblemBase + "ErrInFlight"
	// TypeOutcomeUnknown is the type of the final answer to a retry whose
	// earlier holder was abandoned, under the at-most-once policy: never
	// retried.
	TypeOutcomeUnknown = ProblemBase + "ErrOutcomeUnknown"
	// TypeKeyMismatch is the type of the 422 for a key reused for another
	// request: never retried.
	TypeKeyMismatch = ProblemBase + "ErrKeyMismatch"
)

// The stable code member of every problem the middleware writes: a short
// machine-readable string per problem.
const (
	CodeKeyMissing       = "key_missing"
	CodeKeyInvalid       = "key_invalid"
	CodeKeyTooLong       = "key_too_long"
	CodeKeyMismatch      = "key_mismatch"
	CodeInFlight         = "in_flight"
	CodeStoreUnavailable = "store_unavailable"
	CodeOutcomeUnknown   = "outcome_unknown"
	CodeBodyTooLarge     = "body_too_large"
	CodeBodyUnreadable   = "body_unreadable"
	CodeUnidentified     = "request_unidentified"
)
