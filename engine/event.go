package engine

import (
	"context"
	"time"
)

// An Event is what the engine did with one call, or with the lease of one,
// for an Observer (Config.Observer): the raw
// material of metrics, traces and logs. Every protected request yields exactly one event of a
// final kind; a request that acquires its key yields an EventAcquired before
// it, and lease renewals yield their own.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Scope and Key name the record; empty when the call was refused
	// before they were known. Scope is what the door's scope gave (for the
	// HTTP middleware, by default a hash of the credential headers, never
	// the headers).
	Scope, Key string
	// Status is the status the caller was answered with (the HTTP
	// status code for the middleware, the door's own status for other
	// doors); 0 when no answer could be sent (the caller had gone, the
	// work panicked).
	Status int
	// Start is when the door began with the call (for lease events, when
	// the Extend began).
	Start time.Time
	// ClaimTook is how long the Claim took, waits (Config.Wait) included.
	ClaimTook time.Duration
	// HandlerTook is how long the handler ran.
	HandlerTook time.Duration
	// StoreTook is how long the write after the handler took (Complete or
	// Release, retries included), or the Extend of a lease event.
	StoreTook time.Duration
	// Err is the store's error when one decided the outcome (Unavailable,
	// NotStored, a lease lost), or the cause of a refusal; nil otherwise.
	Err error
	// Acquired reports, on a final event, that the request held the key:
	// an EventAcquired came before it, and the key is no longer held by
	// it. With EventAcquired it counts the claims in flight.
	Acquired bool
}

// EventKind says what the engine did.
type EventKind int

// The kinds of Event. Each protected request ends with one of the first ten
// or with EventOutcomeUnknown; EventLeaseRenewed and EventLeaseLost come
// from the lease's renewal, and EventAcquired from a claim that acquired the
// key.
const (
	// EventExecuted: the handler ran for the first time and its response
	// was stored.
	EventExecuted EventKind = iota + 1
	// EventReplayed: the stored response was replayed.
	EventReplayed
	// EventInFlight: refused with 409, the key being in flight.
	EventInFlight
	// EventMismatch: refused with 422, the key used for another request.
	EventMismatch
	// EventRejected: refused with 400 or 413 before any claim: the key
	// missing, malformed or refused by WithKeyFormat, the body too large or
	// unreadable, the request not identified.
	EventRejected
	// EventUnavailable: refused with 503 because the store failed or was
	// too slow (or a transactional store could not commit).
	EventUnavailable
	// EventReleased: the handler ran, or began to, and the key was given
	// back: a 5xx, 408 or 429, a panic, or no answer after its context
	// ended. A retry runs again.
	EventReleased
	// EventNotStored: the handler ran and its response was sent, but
	// Complete failed even when retried within the store timeout; the
	// middleware goes on storing it after the request (see
	// Engine.Shutdown), and the key stays in flight until then, or
	// until its lease ends.
	EventNotStored
	// EventUnprotected: the handler ran without protection: no key while
	// keys are optional, or the store failed with Config.FailOpen.
	EventUnprotected
	// EventClientGone: the client went away before the handler ran;
	// nothing ran and nothing is left claimed.
	EventClientGone
	// EventLeaseRenewed: the lease was extended while the request ran.
	EventLeaseRenewed
	// EventLeaseLost: the lease was lost, or ended without renewal, and
	// the handler's context was cancelled; Err is the cause.
	EventLeaseLost
	// EventAcquired: the claim acquired the key, and the handler is about
	// to run; ClaimTook is how long that took. The request's final event
	// follows, with Acquired set.
	EventAcquired
	// EventOutcomeUnknown: under RefuseAbandoned, the claim took over a
	// key whose earlier holders were abandoned; the handler did not run and
	// the final "outcome unknown" answer was recorded and sent (409). If
	// the store failed to record it, the request ends with
	// EventUnavailable instead. A final kind, like the first ten.
	EventOutcomeUnknown
)

var eventKindNames = [...]string{
	EventExecuted:       "executed",
	EventReplayed:       "replayed",
	EventInFlight:       "in_flight",
	EventMismatch:       "mismatch",
	EventRejected:       "rejected",
	EventUnavailable:    "unavailable",
	EventReleased:       "released",
	EventNotStored:      "not_stored",
	EventUnprotected:    "unprotected",
	EventClientGone:     "client_gone",
	EventLeaseRenewed:   "lease_renewed",
	EventLeaseLost:      "lease_lost",
	EventAcquired:       "acquired",
	EventOutcomeUnknown: "outcome_unknown",
}

// String returns the kind's name, in snake case for use as a metric
// attribute: "executed", "replayed", "in_flight", ...
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// An Observer receives the engine's events. It is called on the call's
// goroutine (on a timer's for lease events) before the call returns, so it
// must be quick, and safe for concurrent use. A panic in it is recovered,
// and logged the first time only.
type Observer func(ctx context.Context, e Event)

// timing is when each step of an exchange ended, kept only for an observer.
type timing struct {
	start, claim, handler, store time.Time
}

func (t *timing) claimed(e *Engine) {
	if e.cfg.Observer != nil {
		t.claim = time.Now()
	}
}

func (t *timing) handled(e *Engine) {
	if e.cfg.Observer != nil {
		t.handler = time.Now()
	}
}

func (t *timing) stored(e *Engine) {
	if e.cfg.Observer != nil {
		t.store = time.Now()
	}
}

// since is end - start, or zero when either is unknown.
func since(start, end time.Time) time.Duration {
	if start.IsZero() || end.IsZero() {
		return 0
	}
	return end.Sub(start)
}

// emit tells the observer, if there is one, how the call ended.
func (c *Call) emit(kind EventKind, status int, err error) {
	if c.e.cfg.Observer == nil {
		return
	}
	t := &c.timing
	if t.start.IsZero() {
		t.start = t.claim
	}
	if t.handler.IsZero() {
		// Refused or replayed: nothing ran after the claim.
		t.handler = t.claim
	}
	if t.store.IsZero() {
		t.store = t.handler
	}
	c.e.notify(c.ctx, Event{
		Kind: kind, Scope: c.lease.Scope, Key: c.lease.Key, Status: status,
		Start: t.start, ClaimTook: since(t.start, t.claim), HandlerTook: since(t.claim, t.handler), StoreTook: since(t.handler, t.store),
		Err: err, Acquired: c.acquired,
	})
}

// acquire records that the claim acquired the key, and tells the observer.
func (c *Call) acquire() {
	c.acquired = true
	if c.e.cfg.Observer != nil {
		t := &c.timing
		c.e.notify(c.ctx, Event{
			Kind: EventAcquired, Scope: c.lease.Scope, Key: c.lease.Key,
			Start: t.start, ClaimTook: since(t.start, t.claim),
		})
	}
}
