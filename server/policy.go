package server

import "github.com/idemkit/idempotency/engine"

// AbandonedPolicy decides what a request gets when its Claim takes over a
// key whose earlier holders were abandoned: [engine.AbandonedPolicy].
type AbandonedPolicy = engine.AbandonedPolicy

const (
	// RerunAbandoned, the default, runs the handler again, with the
	// takeover visible in its Lease (Lease.Abandoned, Lease.Attempt): the
	// handler looks for its own effect before doing it again. With effects
	// in another service, the key the client derives from the incoming key
	// deduplicates them there.
	RerunAbandoned = engine.RerunAbandoned
	// RefuseAbandoned makes the request at most once: the handler does not
	// run again, and the key is recorded as done with a final problem,
	// "outcome unknown" (ErrOutcomeUnknown), replayed for the TTL to every
	// retry, until an operator resolves it (Inspector.Resolve). A Claim
	// whose answer was lost (the store applied it, then failed or timed
	// out: the client got 503, and the handler did not run) leaves a
	// holder that the store cannot tell from one that ran; the retry that
	// takes the key over after its lease is refused too, so an "outcome
	// unknown" may be a request that never ran. So does a release that the
	// store did not take before the lease ended (a 5xx while the store was
	// away for longer than the lease). The refusal holds whatever the TTL
	// and the lease ([WithTTL]), and after a takeover that gave the key
	// back (its count of lost holders is kept).
	RefuseAbandoned = engine.RefuseAbandoned
)

// HeaderOutcome is the response header, stored and replayed with the
// "outcome unknown" answer, that marks it: "Idempotent-Outcome: unknown".
// Response.OutcomeUnknown looks for it, so that an operator's tool can tell
// such a record from a completed request. A handler cannot forge it: it is
// never stored from a handler's response.
const HeaderOutcome = engine.HeaderOutcome

// WithAbandoned sets what a request gets when its Claim takes over a key
// whose earlier holders were abandoned: RerunAbandoned (the default) or
// RefuseAbandoned.
//
// The refusal's status is 409 Conflict, without Retry-After: the request
// conflicts with the state of the key's record, which only an operator can
// settle, as the Idempotency-Key draft and the payment APIs that use keys
// answer a key that cannot be processed as asked. It is not a 5xx, which
// every client retries, and not 422, which means the key was reused for
// another request. The client of this module retries a 409 only when it is
// the in-flight problem or carries Retry-After, so it treats this one as
// final; its problem type is
// https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrOutcomeUnknown
// and its code "outcome_unknown".
func WithAbandoned(p AbandonedPolicy) Option {
	return func(c *config) {
		if p != RerunAbandoned && p != RefuseAbandoned {
			c.invalid("WithAbandoned: unknown policy %d", int(p))
			return
		}
		c.abandoned = p
	}
}
