package server

import "github.com/idemkit/idempotency/engine"

// An Event is what the middleware did with one request, or with the lease of
// one, for an observer set with [WithObserver]: [engine.Event], whose
// Status is the HTTP status code the client was sent.
type Event = engine.Event

// EventKind says what the middleware did: [engine.EventKind].
type EventKind = engine.EventKind

// An Observer receives the middleware's events: [engine.Observer]. It is
// called on the request's goroutine (on a timer's for lease events) before
// the middleware returns, so it must be quick, and safe for concurrent use.
// A panic in it is recovered ([WithObserver] says how).
type Observer = engine.Observer

// The kinds of Event: [engine.EventExecuted] and the others, where each
// is documented. Each protected request ends with one of the first ten or
// with EventOutcomeUnknown; EventLeaseRenewed and EventLeaseLost come from
// the lease's renewal, and EventAcquired from a claim that acquired the key.
const (
	EventExecuted       = engine.EventExecuted
	EventReplayed       = engine.EventReplayed
	EventInFlight       = engine.EventInFlight
	EventMismatch       = engine.EventMismatch
	EventRejected       = engine.EventRejected
	EventUnavailable    = engine.EventUnavailable
	EventReleased       = engine.EventReleased
	EventNotStored      = engine.EventNotStored
	EventUnprotected    = engine.EventUnprotected
	EventClientGone     = engine.EventClientGone
	EventLeaseRenewed   = engine.EventLeaseRenewed
	EventLeaseLost      = engine.EventLeaseLost
	EventAcquired       = engine.EventAcquired
	EventOutcomeUnknown = engine.EventOutcomeUnknown
)
