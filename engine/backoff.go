package engine

import "time"

// backoff spaces the tries of one operation: the waits between them double
// from the first to the longest, and none is taken past a deadline. The
// engine waits with it for a holder in flight (Config.Wait), for a store
// write within the store timeout, and for a store write after the answer,
// within the lease.
//
// A backoff belongs to one goroutine; make it with newBackoff and stop it
// when done with it, which releases its timer.
type backoff struct {
	step, longest time.Duration
	deadline      time.Time
	// clip cuts the last wait short, to end at the deadline, when the
	// deadline bounds when the last try begins (Config.Wait: the try has a
	// timeout of its own). Without it, a wait that would not end before the
	// deadline is not taken: the deadline bounds the tries themselves (the
	// store timeout), and a try that began at it would have no time left.
	clip  bool
	timer *time.Timer
}

// newBackoff returns a backoff whose first wait is first, doubling up to
// longest, that takes no wait past deadline.
func newBackoff(first, longest time.Duration, deadline time.Time, clip bool) backoff {
	return backoff{step: first, longest: longest, deadline: deadline, clip: clip}
}

// next returns the wait before the next try, as of now, and false when the
// deadline leaves room for none. Each call doubles the wait after it.
func (b *backoff) next(now time.Time) (time.Duration, bool) {
	d := b.step
	if b.clip {
		left := b.deadline.Sub(now)
		if left <= 0 {
			return 0, false
		}
		d = min(d, left)
	} else if !now.Add(d).Before(b.deadline) {
		return 0, false
	}
	b.step = min(2*b.step, b.longest)
	return d, true
}

// sleep waits for d, and reports false if done (nil: never) was closed
// first.
func (b *backoff) sleep(d time.Duration, done <-chan struct{}) bool {
	if b.timer == nil {
		b.timer = time.NewTimer(d)
	} else {
		b.timer.Reset(d)
	}
	select {
	case <-b.timer.C:
		return true
	case <-done:
		return false
	}
}

// wait waits the next wait, and reports whether a try may follow: false
// when the deadline leaves no room for one, or done (nil: never) was closed.
func (b *backoff) wait(done <-chan struct{}) bool {
	d, ok := b.next(time.Now())
	return ok && b.sleep(d, done)
}

// stop releases the timer.
func (b *backoff) stop() {
	if b.timer != nil {
		b.timer.Stop()
	}
}
