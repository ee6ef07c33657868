package engine

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/idemkit/idempotency/internal/incoming"
	"github.com/idemkit/idempotency/internal/steps"
)

// Lease describes the lease that protected work runs under. The work can
// pass its Token to downstream systems so that they refuse writes from a
// holder whose lease was lost.
//
// Abandoned tells a handler that it took over a request whose earlier
// holders never completed or released it (their process died, hung, or lost
// its store): they may have done the work before they were lost. Such a
// handler must look for its own effect first (an order with this key, a
// payment whose downstream idempotency key it derives from Key) and answer
// with it rather than do it again; Config.Abandoned can refuse such
// requests instead. A step (package step) that a lost holder finished is
// not run again whatever the policy.
type Lease struct {
	ID
	Token Token
	// Abandoned counts the holders of this key that came before and were
	// lost without completing or releasing it (Claim.Abandoned): 0 on a
	// request's first run.
	Abandoned int
}

type leaseKey struct{}

// LeaseFromContext returns the lease of the work that ctx belongs to, if a
// door protects it. The work's context is cancelled when the lease is lost
// or ends without renewal; context.Cause then wraps ErrLeaseLost.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	if !ok {
		return Lease{}, false
	}
	return *l, true
}

// leaseContext is the handler's context: the request's, cancelled if the
// lease is lost, carrying the lease and the incoming key that the client
// derives downstream keys from (allocations fewer than context.WithValue).
type leaseContext struct {
	context.Context
	lease   *Lease
	in      *incoming.Key
	journal *steps.Journal
}

func (c *leaseContext) Value(key any) any {
	switch key.(type) {
	case leaseKey:
		return c.lease
	case incoming.ContextKey:
		return c.in
	case steps.ContextKey:
		return c.journal
	}
	return c.Context.Value(key)
}

// renewal keeps the lease alive from the claim until the response is stored
// or the claim released, and knows when the lease ends.
//
// The store's lease cannot have begun before the Claim or Extend that granted
// it was sent, so the lease is known to last at least until that moment plus
// its length. The renewal extends it every third of its length, and every
// tenth after a failure. When that known end, less a margin for the handler
// to stop, passes without a successful renewal, whatever the reason (the
// store is down, too slow, or says the lease is lost), the handler's context
// is cancelled: from then on another request may take the key over and run
// it, and the two must not run at once. Fencing makes sure that the late
// holder's Complete or Release changes nothing.
//
// After the handler's context is cancelled for a lease that ended unrenewed,
// the renewal goes on trying to extend it: until someone else takes the key
// over, the store still grants it, and a lease held again keeps retries from
// running the request while its response is being stored.
//
// It runs on one timer, not a goroutine of its own. Stopping it cuts short an
// Extend in progress (through its context) and waits for it to return, so
// that nothing of the exchange outlives the request.
type renewal struct {
	c      *Call
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	timer    *time.Timer
	until    time.Time // the lease is known to last until then
	lastErr  error     // of the last Extend, if it failed
	renewing bool      // an Extend is in progress
	ended    bool      // the handler was cancelled: the lease ended unrenewed
	stopped  bool      // the exchange is over, or the lease is lost
	extend   *detached // the context of the Extend in progress
	inflight sync.WaitGroup
}

// leaseExpired is the cause of a handler's cancellation when its lease ended
// without a successful renewal.
type leaseExpired struct{ last error }

func (e *leaseExpired) Error() string {
	if e.last == nil {
		return "engine: " + ErrLeaseExpired.Error()
	}
	return "engine: " + ErrLeaseExpired.Error() + ": last renewal: " + e.last.Error()
}

func (e *leaseExpired) Unwrap() []error {
	if e.last == nil {
		return []error{ErrLeaseExpired}
	}
	return []error{ErrLeaseExpired, e.last}
}

// margin is how long before the lease's known end the handler is cancelled.
func (rn *renewal) margin() time.Duration { return leaseMargin(rn.c.e.cfg.Lease) }

// leaseMargin is the part of a lease that the handler never runs in: a
// tenth of it, time for a cancelled handler to stop before another request
// may take the key over.
func leaseMargin(lease time.Duration) time.Duration { return lease / 10 }

// start begins renewing the lease granted by the Claim sent at c.claimed.
// It reports false, and starts nothing, when that lease has less than its
// margin left: the Claim's answer came too late for the handler to run, and
// a renewal that cancelled it from a timer would race its first lines.
func (rn *renewal) start(c *Call, cancel context.CancelCauseFunc) bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.c, rn.cancel = c, cancel
	rn.until = addSat(c.claimed, c.e.cfg.Lease)
	now := time.Now()
	if !now.Before(rn.until.Add(-rn.margin())) {
		rn.stopped = true
		return false
	}
	rn.timer = time.AfterFunc(rn.nextRenewal(now), rn.tick)
	return true
}

// nextRenewal is how long to wait, from now, before the next Extend: a third
// of the lease after a success, a tenth after a failure, and, while the
// handler runs, never past the moment it must be cancelled. rn.mu is held.
func (rn *renewal) nextRenewal(now time.Time) time.Duration {
	lease := rn.c.e.cfg.Lease
	d := lease / 3
	if rn.lastErr != nil || rn.ended {
		d = lease / 10
	}
	if !rn.ended {
		left := rn.until.Add(-rn.margin()).Sub(now)
		if left <= 0 {
			return 0
		}
		d = min(d, left)
	}
	return d
}

// tick runs on the timer: it cancels the handler if the lease's known end
// has passed, and renews the lease.
func (rn *renewal) tick() {
	rn.mu.Lock()
	if rn.stopped {
		rn.mu.Unlock()
		return
	}
	c, e := rn.c, rn.c.e
	now := time.Now()
	if !rn.ended && !now.Before(rn.until.Add(-rn.margin())) {
		rn.ended = true
		rn.endHandler(&leaseExpired{last: rn.lastErr})
	}
	if rn.renewing {
		// An Extend is still out: look again later.
		rn.timer.Reset(rn.nextRenewal(now))
		rn.mu.Unlock()
		return
	}
	rn.renewing = true
	timeout := e.cfg.StoreTimeout
	if !rn.ended {
		// Wake up when the lease ends, whatever the Extend does.
		end := rn.until.Add(-rn.margin()).Sub(now)
		rn.timer.Reset(end)
		timeout = min(timeout, end)
	} else {
		rn.timer.Reset(rn.nextRenewal(now))
	}
	ctx := new(detached)
	ctx.init(c.ctx, timeout)
	rn.extend = ctx
	rn.inflight.Add(1)
	defer rn.inflight.Done()
	rn.mu.Unlock()

	err := e.store.Extend(ctx, c.lease.ID, c.lease.Token, e.cfg.Lease)
	ctx.stop()

	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.renewing = false
	rn.extend = nil
	if rn.stopped {
		return
	}
	switch {
	case err == nil:
		rn.until = addSat(now, e.cfg.Lease)
		rn.lastErr = nil
		e.Observe(c.ctx, Event{Kind: EventLeaseRenewed, Scope: c.lease.Scope, Key: c.lease.Key, Start: now, StoreTook: time.Since(now)})
	case errors.Is(err, ErrLeaseLost):
		rn.stopped = true
		rn.timer.Stop()
		if !rn.ended {
			rn.ended = true
			rn.endHandler(err)
		}
		return
	default:
		rn.lastErr = err
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lease not renewed; trying again",
			slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope),
			slog.Duration("left", time.Until(rn.until)), slog.Any("error", err))
	}
	rn.timer.Reset(rn.nextRenewal(time.Now()))
}

// endHandler cancels the handler with cause: its lease is gone, or may be.
// rn.mu is held.
func (rn *renewal) endHandler(cause error) {
	c := rn.c
	c.e.cfg.Logger.LogAttrs(c.ctx, slog.LevelError, "idempotency lease lost while the work ran; cancelling its context",
		slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Any("cause", cause))
	rn.cancel(cause)
	c.e.Observe(c.ctx, Event{Kind: EventLeaseLost, Scope: c.lease.Scope, Key: c.lease.Key, Start: time.Now(), Err: cause})
}

// stop ends the renewal: it cuts short an Extend in progress and waits for
// it to return.
func (rn *renewal) stop() {
	rn.mu.Lock()
	rn.stopped = true
	rn.timer.Stop()
	if rn.extend != nil {
		rn.extend.expireNow()
	}
	rn.mu.Unlock()
	rn.inflight.Wait()
}

// addSat is t.Add(d), saturated: a duration from the configuration, however
// long, never wraps a deadline into the past.
func addSat(t time.Time, d time.Duration) time.Time {
	u := t.Add(d)
	if d > 0 && u.Before(t) {
		return time.Unix(1<<62, 0)
	}
	return u
}

// addDur is a + b for b >= 0, saturated at the longest duration.
func addDur(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
