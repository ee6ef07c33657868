package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Lease describes the lease a protected handler runs under. The handler can
// pass its Token to downstream systems so that they refuse writes from a
// holder whose lease was lost.
type Lease struct {
	ID
	Token Token
}

type leaseKey struct{}

// LeaseFromContext returns the lease of the request being handled, if the
// middleware protects it. The handler's context is cancelled when the lease
// is lost or ends without renewal; context.Cause then wraps ErrLeaseLost.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	if !ok {
		return Lease{}, false
	}
	return *l, true
}

// leaseContext is the handler's context: the request's, cancelled if the
// lease is lost, carrying the lease (one allocation fewer than
// context.WithValue).
type leaseContext struct {
	context.Context
	lease *Lease
}

func (c *leaseContext) Value(key any) any {
	if _, ok := key.(leaseKey); ok {
		return c.lease
	}
	return c.Context.Value(key)
}

// renewal keeps the lease alive from the claim until the response is stored
// or the claim released, and knows when the lease ends.
//
// The store's lease cannot have begun before the Claim or Extend that granted
// it was sent, so the lease is known to last at least until that moment plus
// its length. The renewal extends it every third of its length, and sooner
// after a failure. When that known end, less a margin for the handler to
// stop, passes without a successful renewal, whatever the reason (the store
// is down, too slow, or says the lease is lost), the handler's context is
// cancelled: from then on another request may take the key over and run it,
// and the two must not run at once. Fencing makes sure that the late
// holder's Complete or Release changes nothing.
//
// It runs on one timer, not a goroutine of its own. An Extend in progress
// when the renewal stops is left to finish on its own, within its deadline,
// and its result is ignored.
type renewal struct {
	ex     *exchange
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	timer    *time.Timer
	until    time.Time // the lease is known to last until then
	lastErr  error     // of the last Extend, if it failed
	renewing bool      // an Extend is in progress
	stopped  bool      // the exchange is over, or the lease is gone
}

// leaseExpired is the cause of a handler's cancellation when its lease ended
// without a successful renewal.
type leaseExpired struct{ last error }

func (e *leaseExpired) Error() string {
	if e.last == nil {
		return "server: " + ErrLeaseExpired.Error()
	}
	return "server: " + ErrLeaseExpired.Error() + ": last renewal: " + e.last.Error()
}

func (e *leaseExpired) Unwrap() []error {
	if e.last == nil {
		return []error{ErrLeaseExpired}
	}
	return []error{ErrLeaseExpired, e.last}
}

// margin is how long before the lease's known end the handler is cancelled.
func (rn *renewal) margin() time.Duration { return rn.ex.m.cfg.lease / 10 }

func (rn *renewal) start(ex *exchange, cancel context.CancelCauseFunc) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.ex, rn.cancel = ex, cancel
	rn.until = ex.claimed.Add(ex.m.cfg.lease)
	rn.timer = time.AfterFunc(rn.nextRenewal(time.Now()), rn.tick)
}

// nextRenewal is how long to wait, from now, before the next Extend: a third
// of the lease after a success, a tenth after a failure, and never past the
// moment the handler is cancelled. rn.mu is held.
func (rn *renewal) nextRenewal(now time.Time) time.Duration {
	lease := rn.ex.m.cfg.lease
	step := lease / 3
	if rn.lastErr != nil {
		step = lease / 10
	}
	return max(min(step, rn.until.Add(-rn.margin()).Sub(now)), 0)
}

// tick runs on the timer: it either finds the lease ended, or renews it.
func (rn *renewal) tick() {
	rn.mu.Lock()
	if rn.stopped {
		rn.mu.Unlock()
		return
	}
	ex := rn.ex
	now := time.Now()
	end := rn.until.Add(-rn.margin())
	if !now.Before(end) {
		rn.expire(&leaseExpired{last: rn.lastErr})
		rn.mu.Unlock()
		return
	}
	if rn.renewing {
		// The timer was set for the lease's end while an Extend is still
		// out; it is not over yet.
		rn.timer.Reset(end.Sub(now))
		rn.mu.Unlock()
		return
	}
	rn.renewing = true
	// Whatever the Extend does, wake up when the lease ends.
	rn.timer.Reset(end.Sub(now))
	rn.mu.Unlock()

	m := ex.m
	ctx := new(detached)
	ctx.init(ex.r.Context(), min(m.cfg.storeTimeout, end.Sub(now)))
	err := m.store.Extend(ctx, ex.lease.ID, ex.lease.Token, m.cfg.lease)
	ctx.stop()

	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.renewing = false
	if rn.stopped {
		return
	}
	switch {
	case err == nil:
		rn.until = now.Add(m.cfg.lease)
		rn.lastErr = nil
		m.observe(ex.r, Event{Kind: EventLeaseRenewed, Scope: ex.lease.Scope, Key: ex.lease.Key, Start: now, Store: time.Since(now)})
	case errors.Is(err, ErrLeaseLost):
		rn.expire(err)
		return
	default:
		rn.lastErr = err
		m.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lease not renewed; trying again before it ends",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope),
			slog.Duration("left", time.Until(rn.until)), slog.Any("error", err))
	}
	rn.timer.Reset(rn.nextRenewal(time.Now()))
}

// expire cancels the handler with cause: its lease is gone, or may be, and
// nothing more is done for it. rn.mu is held.
func (rn *renewal) expire(cause error) {
	rn.stopped = true
	rn.timer.Stop()
	ex := rn.ex
	ex.m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotency lease lost while the request was handled; cancelling the handler",
		slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("cause", cause))
	rn.cancel(cause)
	ex.m.observe(ex.r, Event{Kind: EventLeaseLost, Scope: ex.lease.Scope, Key: ex.lease.Key, Start: time.Now(), Err: cause})
}

// stop ends the renewal. It does not wait for an Extend in progress, which
// ends within its own deadline.
func (rn *renewal) stop() {
	rn.mu.Lock()
	rn.stopped = true
	rn.timer.Stop()
	rn.mu.Unlock()
}
