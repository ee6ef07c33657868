package engine

import (
	"errors"
	"log/slog"
	"time"
)

// storeLater reports whether a Complete that failed with err should be tried
// again after the result is answered: the store failed, rather than refused.
func storeLater(err error) bool {
	return err != nil && !final(err)
}

// final reports whether a store write that failed with err cannot succeed
// if tried again.
func final(err error) bool {
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotCommitted) ||
		errors.Is(err, ErrNotStorable) || errors.Is(err, ErrStoreClosed)
}

// completeWithin stores resp with Complete, trying again until the store
// takes it, refuses it for good (final), or the store timeout leaves no
// room for another try.
func (c *Call) completeWithin(resp *Response) error {
	e := c.e
	ctx := c.writeContext()
	defer ctx.stop()
	b := writeBackoff(ctx)
	defer b.stop()
	for {
		err := e.store.Complete(ctx, c.lease.ID, c.lease.Token, resp, e.cfg.TTL)
		if err == nil || final(err) || !b.wait(nil) {
			return err
		}
	}
}

// releaseWithin gives the key back with Release, trying again as
// completeWithin does.
func (c *Call) releaseWithin() error {
	e := c.e
	ctx := c.writeContext()
	defer ctx.stop()
	b := writeBackoff(ctx)
	defer b.stop()
	for {
		err := e.store.Release(ctx, c.lease.ID, c.lease.Token)
		if err == nil || final(err) || !b.wait(nil) {
			return err
		}
	}
}

// writeBackoff spaces the tries of one write within ctx's deadline, the
// store timeout: from 5ms, doubling up to a quarter of a second.
func writeBackoff(ctx *detached) backoff {
	return newBackoff(5*time.Millisecond, 250*time.Millisecond, ctx.deadline, false)
}

// writeContext returns the context of a write after the work, whose tries
// share it: the store timeout bounds them all.
func (c *Call) writeContext() *detached {
	if c.storeCtx.values == nil {
		// The call's one write after the work: its context lives in the
		// Call, like the first Claim's, and is never reused.
		c.storeCtx.init(c.ctx, c.e.cfg.StoreTimeout)
		return &c.storeCtx
	}
	return c.storeContext(c.e.cfg.StoreTimeout)
}

// storeContext is for store calls that must finish even when the caller has
// gone. Each call has a context of its own: a Store may leave a goroutine
// watching the last one for a while after it returned (a context derived
// from it, whose cancellation propagates asynchronously).
func (c *Call) storeContext(timeout time.Duration) *detached {
	ctx := new(detached)
	ctx.init(c.ctx, timeout)
	return ctx
}

// complete stores the result, retrying within the store timeout while the
// lease is kept alive. An error is logged here; the caller looks only for
// ErrNotCommitted.
func (c *Call) complete(resp *Response) error {
	e := c.e
	err := c.completeOrOmit(resp, c.completeWithin)
	c.timing.stored(e)
	log := func(level slog.Level, msg string) {
		e.cfg.Logger.LogAttrs(c.ctx, level, msg,
			slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Any("error", err))
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrNotCommitted):
		log(slog.LevelError, "idempotent request not committed; the caller is told to retry")
	case errors.Is(err, ErrStoreClosed):
		log(slog.LevelWarn, "idempotent response not stored: the store was closed")
	case errors.Is(err, ErrNotStorable):
		log(slog.LevelError, "idempotent response refused by the store even without its body; answering with it, and the key stays in flight until its lease ends")
	case errors.Is(err, ErrLeaseLost):
		// Either a try whose answer was lost stored it, or the lease
		// was lost to a retry.
		log(slog.LevelWarn, "idempotent response not stored by this holder: stored by an earlier try whose answer was lost, or the lease was lost")
	default:
		// The result goes to the caller anyway, the key stays claimed,
		// and completeLater goes on trying.
		log(slog.LevelError, "idempotent response not stored within the store timeout; answering with it, and storing it when the store answers")
	}
	return err
}

// release gives the key back, retrying within the store timeout. The work
// did nothing that must be kept, and the caller is told to retry, so the
// retry must run it again: if the store is down, the release goes on in the
// background (releaseLater); with renewing, the lease's renewal, which
// then keeps the key from a takeover until the release is written, goes
// with it (Call.renewalHandedOff). A release never
// written would leave the key in flight until its lease ended, and then
// the retry would be told of an abandoned holder (under RefuseAbandoned,
// answered "outcome unknown") for a call that the door knew did nothing.
func (c *Call) release(why string, renewing bool) {
	e := c.e
	err := c.releaseWithin()
	c.timing.stored(e)
	if err == nil {
		return
	}
	if storeLater(err) && c.releaseAfterFailure(renewing) {
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency claim not released within the store timeout; retries are refused as in flight while it is tried again in the background",
			slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.String("reason", why), slog.Any("error", err))
		return
	}
	e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency claim not released; retries are refused as in flight until its lease expires",
		slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.String("reason", why), slog.Any("error", err))
}

// completeOrOmit stores resp with complete and, if the store will never take
// it (ErrNotStorable), records the request as done without its body, then,
// if even that is refused, without its headers: a request that ran must not
// run again because its answer is too large for the store.
func (c *Call) completeOrOmit(resp *Response, complete func(*Response) error) error {
	err := complete(resp)
	if !errors.Is(err, ErrNotStorable) {
		return err
	}
	c.e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotent response cannot be stored; recording the request as done without its body",
		slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Int("status", resp.Status), slog.Any("error", err))
	if !resp.BodyOmitted || len(resp.Body) > 0 {
		resp = &Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}
		if err = complete(resp); !errors.Is(err, ErrNotStorable) {
			return err
		}
	}
	if len(resp.Header) == 0 {
		return err
	}
	return complete(&Response{Status: resp.Status, BodyOmitted: true})
}
