package idempotency

import (
	"context"
	"net/http"
	"time"
)

// An Event is what the Client did with one attempt, for an observer set with
// WithObserver: the raw material of metrics, traces and logs. Every attempt
// yields exactly one event: EventRetried for an attempt that is retried, and
// one of the final kinds for the last attempt of a call, which says how the
// call ended. A call whose context ends while it waits to retry ends with an
// EventCanceled of its own, for no attempt. A call refused before its first
// attempt (a nil request, ErrInvalidURL, ErrInvalidKey, a body that cannot
// be read) yields none.
type Event struct {
	// Kind says what followed the attempt.
	Kind EventKind
	// Key is the idempotency key sent on every attempt, or "" if the
	// request carried none.
	Key string
	// Method is the request's method.
	Method string
	// Call is the same on every event of one call to Do, and differs from
	// that of every other call of the Client, so that an observer can tell
	// which attempts belong together.
	Call uint64
	// Attempt is the attempt's number, from 1; on a final event, the
	// number of attempts made.
	Attempt int
	// Start is when the call began.
	Start time.Time
	// Sent is when the attempt was sent, and Took how long it took to its
	// response headers or its error. Both are zero on an EventCanceled that
	// ended a wait.
	Sent time.Time
	Took time.Duration
	// Elapsed is the time from Start to this event.
	Elapsed time.Duration
	// StatusCode is the attempt's status, or 0 if it had no response.
	StatusCode int
	// Err is the attempt's error, or nil if it had a response; on an
	// EventCanceled that ended a wait, the context's error. Which kind of
	// error it is, errors.Is tells: ErrAttemptTimeout (or another error
	// whose Timeout method reports true) for a timeout, context.Canceled or
	// context.DeadlineExceeded for the caller's context, else an error of
	// the transport. It is usually
	// an *url.Error, whose text holds the request's URL, query included:
	// log its Err rather than itself if the query may hold a secret.
	Err error
	// Replayed reports that the response is marked as a replay, as the
	// request's Dialect reads it (Idempotent-Replayed: true for the zero
	// Dialect).
	Replayed bool
	// Wait is, on EventRetried, how long the Client waits before the next
	// attempt.
	Wait time.Duration
	// Stopped is, on EventGaveUp, why no further attempt was made: one of
	// ErrAttemptsExhausted, ErrNotIdempotent, ErrBodyNotReplayable,
	// ErrDeadline, ErrBudgetExhausted, ErrRetryRefused; on EventCompleted
	// and EventReplayed, the server's final answer (ErrOutcomeUnknown,
	// ErrKeyMismatch), if the response is one.
	Stopped error
	// Budget is the number of tokens left in the Client's retry budget
	// once this attempt's retry took its cost or its success gave tokens
	// back, or -1 if the Client has no budget (WithBudget(nil)).
	Budget int
}

// EventKind says what followed an attempt.
type EventKind int

// The kinds of Event. Each call ends with one of the final kinds, which
// follow EventRetried; Outcome.Kind holds the final kind of a call that
// returned a response.
const (
	// EventRetried: the attempt's result is one that is retried, and
	// another attempt follows after Wait.
	EventRetried EventKind = iota + 1
	// EventCompleted: the attempt got a response that is not retried,
	// whatever its status (a 201, a 422), and that is not marked as a
	// replay. Do returns it.
	EventCompleted
	// EventReplayed: as EventCompleted, for a response that the server
	// marked as the replay of an earlier execution.
	EventReplayed
	// EventGaveUp: the attempt's result is one that is retried, but no
	// further attempt was made; Stopped says why. Do returns the response,
	// or a *RetryError if there is none.
	EventGaveUp
	// EventFailed: the attempt failed with an error that is not retried
	// (a certificate error, a refused redirect). Do returns a *RetryError.
	EventFailed
	// EventCanceled: the caller's context ended, during the attempt or
	// during the wait for the next one.
	EventCanceled
)

var eventKindNames = [...]string{
	EventRetried:   "retried",
	EventCompleted: "completed",
	EventReplayed:  "replayed",
	EventGaveUp:    "gave_up",
	EventFailed:    "failed",
	EventCanceled:  "canceled",
}

// String returns the kind's name, in snake case for use as a metric
// attribute: "retried", "completed", "replayed", "gave_up", ...
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// An Observer receives the Client's events. It is called on the goroutine
// that called Do, before the next attempt's wait or before Do returns, so it
// must be quick, and safe for concurrent use. Its context is the request's.
type Observer func(ctx context.Context, e Event)

// observation is what a call keeps for its observer: its number and start,
// and its last attempt's.
type observation struct {
	id       uint64
	start    time.Time
	sent     time.Time
	took     time.Duration
	status   int
	replayed bool
	err      error
}

// record keeps what the observer is told of the attempt of c that just
// ended.
func (o *observation) record(c *call, resp *http.Response, err error) {
	o.took = time.Since(o.sent)
	o.status, o.replayed = 0, false
	if resp != nil && err == nil {
		o.status = resp.StatusCode
	}
	o.err = err
}

// noAttempt makes the final event one for no attempt: the context ended,
// with err, while the call waited to retry.
func (o *observation) noAttempt(err error) {
	o.sent, o.took = time.Time{}, 0
	o.status, o.replayed, o.err = 0, false, err
}

// emit tells the observer of the attempt that just ended.
func (c *call) emit(kind EventKind) {
	o := c.obs
	e := Event{
		Kind: kind, Key: c.key, Method: c.method, Call: o.id, Attempt: c.attempts,
		Start: o.start, Sent: o.sent, Took: o.took, Elapsed: time.Since(o.start),
		StatusCode: o.status, Err: o.err, Replayed: o.replayed,
		Budget: c.cfg.budget.left(),
	}
	switch kind {
	case EventRetried:
		e.Wait = c.wait
	case EventGaveUp, EventCompleted, EventReplayed:
		e.Stopped = c.stopped
	}
	c.observe(e)
}

// finish tells the observer how the call ended.
func (c *call) finish() {
	kind := c.kind
	if kind == EventCompleted && c.obs.replayed {
		kind = EventReplayed
	}
	c.emit(kind)
}
