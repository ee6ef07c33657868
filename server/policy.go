package server

import "github.com/idemkit/idempotency/engine"

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
func WithAbandoned(p engine.AbandonedPolicy) Option {
	return func(c *config) {
		if p != engine.RerunAbandoned && p != engine.RefuseAbandoned {
			c.invalid("WithAbandoned: unknown policy %d", int(p))
			return
		}
		c.abandoned = p
	}
}
