package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idempotency/internal/incoming"
	"github.com/idemkit/idempotency/internal/steps"
)

// Call is the state of one call, from its claim to its answer: a door
// keeps it in the same allocation as its own state, and passes a zero Call
// to Engine.Do, once.
type Call struct {
	// Start is when the door began with the call, for the Event; when it
	// is zero, the Event counts from the claim.
	Start time.Time

	e           *Engine
	ctx         context.Context // the caller's: values for the store calls, and whether it is still there
	door        Door
	fingerprint string
	lease       Lease
	incoming    incoming.Key // the work's incoming key, for the client
	// claimed is when the Claim that acquired the lease was sent: the
	// store's lease cannot have begun earlier.
	claimed    time.Time
	claimCtx   detached     // the first Claim's context
	storeCtx   detached     // the context of the write after the work
	acquired   bool         // the claim acquired the key
	timing     timing       // for the observer, if there is one
	renewal    renewal      // keeps the lease alive
	handlerCtx leaseContext // the work's context
	journal    steps.Journal
	// renewalHandedOff: a write after the answer took the renewal over,
	// and stops it when it is done.
	renewalHandedOff bool
}

// Lease returns the lease the call holds, or held: its Token is zero until
// the claim acquires the key.
func (c *Call) Lease() Lease { return c.lease }

// Do runs one call for id, whose request has fingerprint, through d: it
// claims the key, and then replays the stored result, refuses the call, or
// runs the work once under a renewed lease and stores its result (or
// releases the key), answering the caller through d. ctx is the caller's:
// the store calls keep its values but not its cancellation (a caller that
// went away is exactly when the retry will come); a caller gone before the
// work began gets no answer, and nothing is left claimed.
//
// c holds the call's state; pass a zero Call, and use it for one call
// only: a result stored in the background keeps it until it is stored.
func (e *Engine) Do(ctx context.Context, c *Call, id ID, fingerprint string, d Door) {
	c.e, c.ctx, c.door, c.fingerprint = e, ctx, d, fingerprint
	c.lease.ID = id
	c.timing.start = c.Start
	c.handle()
}

// handle claims the key, and decides what the call gets for the store's
// answer: a replay, a refusal, or the work run under the lease.
func (c *Call) handle() {
	e, d := c.e, c.door
	cl, err := c.claim()
	if err == nil && cl.Status == InFlight && sameRequest(cl, c.fingerprint) && e.cfg.Wait > 0 {
		cl, err = c.await(cl)
	}
	c.timing.claimed(e)
	if err != nil {
		if c.ctx.Err() != nil {
			// The caller is gone; nothing ran.
			c.emit(EventClientGone, 0, err)
			return
		}
		c.storeFailed(err)
		return
	}
	switch cl.Status {
	case Acquired:
		c.lease.Token, c.lease.Abandoned = cl.Token, cl.Abandoned
		c.acquire()
		if cl.Abandoned > 0 && e.cfg.Abandoned == RefuseAbandoned && len(cl.Steps) == 0 {
			// A lost holder that recorded no step may have done
			// anything: at most once, the call is not run again. One
			// that recorded steps is resumed: its finished steps are
			// replayed, and a step it started and never finished is
			// the step's "outcome unknown", for the work to decide.
			c.outcomeUnknown()
			return
		}
		c.startJournal(cl.Steps)
		if c.ctx.Err() != nil {
			// The caller left while the claim was made: nothing has
			// run, so give the key back rather than leave it in flight.
			c.release("the client went away before the handler ran", false)
			c.emit(EventClientGone, 0, nil)
			return
		}
		c.run()
	case Completed:
		if cl.Response == nil {
			// A broken Store: fail closed, as for any store failure.
			c.storeFailed(errors.New("engine: Claim returned a completed record without its response"))
			return
		}
		if cl.Fingerprint != c.fingerprint {
			c.mismatch()
			return
		}
		status := d.Replay(cl.Response)
		c.emit(EventReplayed, status, nil)
	case InFlight:
		if cl.Fingerprint != "" && cl.Fingerprint != c.fingerprint {
			c.mismatch()
			return
		}
		retryAfter := e.cfg.RetryAfter
		if cl.RetryAfter > 0 {
			// Never longer than the holder's lease has left: by then
			// the retry either gets the answer or takes the key over.
			retryAfter = min(retryAfter, cl.RetryAfter)
		}
		status := d.Refuse(ErrInFlight, retryAfter, nil)
		c.emit(EventInFlight, status, nil)
	default:
		c.storeFailed(fmt.Errorf("engine: Claim returned status %d", cl.Status))
	}
}

// storeFailed answers a call whose claim the store failed: the work runs
// unprotected with FailOpen, and is refused otherwise.
func (c *Call) storeFailed(err error) {
	e := c.e
	if e.cfg.FailOpen {
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelError, "idempotency store failed; running unprotected",
			slog.String("key", c.lease.Key), slog.Any("error", err))
		c.door.Unprotected()
		c.emit(EventUnprotected, 0, err)
		return
	}
	e.cfg.Logger.LogAttrs(c.ctx, slog.LevelError, "idempotency store failed; request refused",
		slog.String("key", c.lease.Key), slog.Any("error", err))
	c.unavailable(err)
}

// unavailable refuses the call with ErrStoreUnavailable: the work was not
// (or may not have been) done, and a retry is safe.
func (c *Call) unavailable(err error) {
	// The event is deferred, so that the call ends for the observer even
	// if the door panics: this may come after the key was acquired and
	// released, and an observer counting the claims in flight must see it
	// end.
	status := unavailableStatus
	defer func() { c.emit(EventUnavailable, status, err) }()
	status = c.door.Refuse(ErrStoreUnavailable, c.e.cfg.RetryAfter, err)
}

// unavailableStatus is the status an Event reports for a refusal with
// ErrStoreUnavailable whose door panicked before it said what it answered:
// the HTTP middleware's 503.
const unavailableStatus = 503

// mismatch refuses a call whose key was used for another request.
func (c *Call) mismatch() {
	status := c.door.Refuse(ErrKeyMismatch, 0, nil)
	c.emit(EventMismatch, status, nil)
}

// run runs the work under the lease, then settles what it did.
func (c *Call) run() {
	e := c.e
	cctx, cancel := context.WithCancelCause(c.ctx)
	defer cancel(nil)
	c.incoming = incoming.Key{Scope: c.lease.Scope, Key: c.lease.Key}
	c.handlerCtx = leaseContext{Context: cctx, lease: &c.lease, in: &c.incoming, journal: &c.journal}
	var ctx context.Context = &c.handlerCtx
	if e.binder != nil {
		ctx = e.binder.Bind(ctx, c.lease.ID, c.lease.Token)
	}
	// The lease is renewed until the result is stored or the key
	// released, not only while the work runs: a retry must not take the
	// key over while the outcome is being written.
	if !c.renewal.start(c, cancel) {
		// The Claim's answer came too late: the lease it granted is
		// over, or nearly, and another call may take the key over and
		// run. The work must not run at the same time.
		c.release("the claim was answered too late to run the handler", false)
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency claim answered after its lease ended, or nearly; the work did not run, and the caller is told to retry",
			slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Duration("claim", time.Since(c.claimed)))
		c.unavailable(errClaimTooLate)
		return
	}
	defer func() {
		if !c.renewalHandedOff {
			c.renewal.stop()
		}
	}()

	done := false
	defer func() {
		if !done {
			c.endSteps()
			// The work panicked: give the key back, and let the panic
			// go on.
			c.timing.handled(e)
			c.release("handler panicked", true)
			c.emit(EventReleased, 0, nil)
		}
	}()
	o := c.door.Execute(ctx)
	done = true
	c.endSteps()
	c.timing.handled(e)
	c.settle(o)
}

// endSteps closes the call's journal once the work has returned, waiting
// for a step being recorded: a step still running on a goroutine of the
// work's is not recorded after that, since it would race the Complete or
// Release that settles the call.
func (c *Call) endSteps() {
	c.journal.Saves.Lock()
	c.journal.Settled = true
	c.journal.Saves.Unlock()
}

// settle decides what the work's outcome comes to: its result stored, then
// answered, or the key released, so that a retry runs the work again.
func (c *Call) settle(o Outcome) {
	switch {
	case o.Response == nil && o.Cause != nil:
		// The work gave up without an answer because its context
		// ended: the caller went away, or the lease could not be kept.
		// An empty result stored now would be replayed for the whole
		// TTL.
		c.release(o.Reason+": "+o.Cause.Error(), true)
		if c.ctx.Err() == nil {
			c.unavailable(o.Cause)
			return
		}
		c.emit(EventReleased, 0, o.Cause)
	case o.Response == nil:
		// Whatever its size, and even if part of it has gone out: a
		// status that says "retry" must let the retry run.
		c.release(o.Reason, true)
		if !o.Sent {
			c.door.Send(false)
		}
		c.emit(EventReleased, o.Status, nil)
	case o.Sent:
		// Already sent, in part or in whole; record that it ran.
		err := c.complete(o.Response)
		if storeLater(err) {
			c.storeAfterSend(o.Response, o.Status, err, true)
			return
		}
		c.completed(o.Status, err)
	default:
		err := c.complete(o.Response)
		if errors.Is(err, ErrNotCommitted) {
			// The work's effects were undone (or may have been): its
			// result must not reach the caller.
			c.unavailable(err)
			return
		}
		if storeLater(err) {
			// Not stored within the store timeout: the effect
			// happened once, and the caller is told what it was now;
			// then the result is stored as soon as the store answers,
			// so that a retry gets it replayed.
			c.storeAfterSend(o.Response, o.Status, err, false)
			return
		}
		c.door.Send(false)
		c.completed(o.Status, err)
	}
}

// completed reports the outcome of a result answered after Complete.
func (c *Call) completed(status int, err error) {
	if err != nil {
		c.emit(EventNotStored, status, err)
		return
	}
	c.emit(EventExecuted, status, nil)
}

// outcomeUnknown records the door's "outcome unknown" answer under the
// lease the Claim granted, then sends it. The work does not run.
//
// If the store fails, the call is refused with ErrStoreUnavailable and the
// key is not released: the store has just failed, and a release that it
// missed would leave the key as this one does. Kept claimed, the key is
// taken over again once the lease ends, and refused again.
func (c *Call) outcomeUnknown() {
	e := c.e
	resp := c.door.OutcomeUnknown()
	e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency key taken over from abandoned holders; recording its outcome as unknown",
		slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Int("abandoned", c.lease.Abandoned))
	if err := c.complete(resp); err != nil {
		c.unavailable(err)
		return
	}
	c.door.Send(false)
	c.emit(EventOutcomeUnknown, resp.Status, nil)
}
