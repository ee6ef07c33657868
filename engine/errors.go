package engine

import (
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/internal/sentinel"
)

// The answers of the protocol that are not a result: every door refuses a
// call with an error that wraps one of them (the HTTP middleware with 409,
// 422 and 503). Match them with errors.Is.
var (
	// ErrKeyMismatch: the key was already used for a different request:
	// another fingerprint. A step (package step) recorded with another
	// input is refused with it too.
	ErrKeyMismatch = sentinel.ErrKeyMismatch
	// ErrInFlight: a request with the same key is still being processed
	// elsewhere.
	ErrInFlight = errors.New("request with this idempotency key in flight")
	// ErrStoreUnavailable: the Store failed, so the request could not be
	// protected and was not run.
	ErrStoreUnavailable = errors.New("idempotency store unavailable")
	// ErrOutcomeUnknown: under RefuseAbandoned, an earlier holder of the
	// key was lost without completing it, so whether the request took
	// effect is unknown; the answer is recorded and replayed for the TTL,
	// and a retry cannot change it.
	ErrOutcomeUnknown = errors.New("outcome of the idempotent request unknown")
)

// ErrResultOmitted is what a later call gets, wrapped, when the work (the
// function door's function, a step) ran but its result was not stored: it
// could not be encoded, or the store refused it (too large). The work is
// not run again.
var ErrResultOmitted = sentinel.ErrResultOmitted

// ErrLeaseExpired is the cause with which the work's context is cancelled
// when its lease ended without a successful renewal: the Store failed or
// was too slow every time it was asked to extend it, and another request may
// now take the key over. It wraps [ErrLeaseLost], so that
// errors.Is(context.Cause(ctx), ErrLeaseLost) holds however the lease was
// lost.
var ErrLeaseExpired = fmt.Errorf("idempotency lease ended without renewal: %w", ErrLeaseLost)

// errClaimTooLate is why a call whose Claim was answered after the lease
// it granted ended (less its margin) is refused.
var errClaimTooLate = errors.New("engine: claim answered after its lease ended")
