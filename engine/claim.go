package engine

import "time"

// claim asks the store for the lease, within the store timeout. Its context
// ignores the caller's cancellation, so that the answer is known: a claim
// abandoned half-way could leave the key in flight until its lease ended.
func (c *Call) claim() (Claim, error) {
	e := c.e
	var ctx *detached
	if c.claimCtx.values == nil {
		// The first claim's context lives in the Call: one allocation
		// fewer on every call. It is never reused.
		ctx = &c.claimCtx
		ctx.init(c.ctx, e.claimTimeout())
	} else {
		ctx = c.storeContext(e.claimTimeout())
	}
	defer ctx.stop()
	c.claimed = time.Now()
	return e.store.Claim(ctx, c.lease.ID, c.fingerprint, e.cfg.Lease, e.cfg.TTL)
}

// claimTimeout bounds a Claim: by the store timeout, and by the lease less
// its margin, since a lease granted by an answer that comes later is too
// short to run the work under.
func (e *Engine) claimTimeout() time.Duration {
	return min(e.cfg.StoreTimeout, e.cfg.Lease-leaseMargin(e.cfg.Lease))
}

// await claims again until the call in flight finishes or the wait ends.
func (c *Call) await(cl Claim) (Claim, error) {
	b := newBackoff(10*time.Millisecond, 250*time.Millisecond, addSat(time.Now(), c.e.cfg.Wait), true)
	defer b.stop()
	for cl.Status == InFlight && sameRequest(cl, c.fingerprint) {
		d, ok := b.next(time.Now())
		if !ok {
			break
		}
		// A millisecond at least: a store whose clock is behind can
		// report a lease with negative time left, and a timer of no
		// length would ask it again at once, for the whole wait.
		d = min(d, addDur(max(cl.RetryAfter, 0), time.Millisecond))
		if !b.sleep(d, c.ctx.Done()) {
			return cl, c.ctx.Err()
		}
		var err error
		if cl, err = c.claim(); err != nil {
			return cl, err
		}
	}
	return cl, nil
}

// sameRequest reports whether an in-flight claim is for the request with
// fingerprint fp, as far as the store can tell.
func sameRequest(c Claim, fp string) bool {
	return c.Fingerprint == "" || c.Fingerprint == fp
}
