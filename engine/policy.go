package engine

// AbandonedPolicy decides what a call gets when its Claim takes over a key
// whose earlier holders were abandoned: they lost their lease without
// completing or releasing it (the process died, hung, or lost its store),
// so they may have done the work before they were lost.
type AbandonedPolicy int

const (
	// RerunAbandoned, the default, runs the work again, with the takeover
	// visible in its Lease (Lease.Abandoned): the work looks
	// for its own effect before doing it again. With effects in another
	// service, a key derived from the incoming key deduplicates them there.
	RerunAbandoned AbandonedPolicy = iota
	// RefuseAbandoned makes the call at most once: the work does not run
	// again, and the key is recorded as done with a final "outcome
	// unknown" answer (ErrOutcomeUnknown, Door.OutcomeUnknown), replayed
	// for the TTL to every retry, until an operator resolves it
	// (Inspector.Resolve). A call whose lost holders recorded steps
	// (package step) is the exception: it is resumed instead, its
	// finished steps replayed and each step started by a lost holder and
	// never finished answered "outcome unknown" to the work (each step
	// records its start under this policy, to know that), so the work
	// must keep every effect inside a step. A Claim whose answer was lost (the store applied
	// it, then failed or timed out: the caller was refused, and the work
	// did not run) leaves a holder that the store cannot tell from one
	// that ran; the retry that takes the key over after its lease is
	// refused too, so an "outcome unknown" may be a call that never ran.
	// So does a release that the store did not take before the lease
	// ended (the work failed while the store was away for longer than
	// the lease); one it missed for less is tried again until it lands.
	// The refusal holds whatever the TTL and the lease, and after a
	// takeover that gave the key back: the record in flight is kept the
	// TTL after its lease's end, and a release keeps the count of lost
	// holders (Store.Release).
	RefuseAbandoned
)

// HeaderOutcome is the header, stored and replayed with the "outcome
// unknown" answer, that marks it: "Idempotent-Outcome: unknown".
// Response.OutcomeUnknown looks for it, so that an operator's tool (and a
// door replaying the record) can tell such a record from a completed call.
// The HTTP middleware never stores it from a handler's response.
const HeaderOutcome = "Idempotent-Outcome"

// OutcomeUnknown reports whether r is the "outcome unknown" answer recorded
// under RefuseAbandoned, rather than the result of a call that ran.
func (r *Response) OutcomeUnknown() bool {
	if r == nil {
		return false
	}
	vs := r.Header[HeaderOutcome]
	return len(vs) > 0 && vs[0] == "unknown"
}
