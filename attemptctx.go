package idempotency

import (
	"context"
	"sync"
	"time"
)

// attemptCtx is the context of the requests of one attempt: the caller's
// context, which it follows, and which it also cancels (if it is timed)
// when the attempt timeout passes before the response headers arrive. Its
// Value method returns the call for callKey, so that OutcomeOf finds it
// from the response.
//
// It costs less than a context.WithCancelCause per attempt and the
// http.Request copy that goes with it: the first attempt's is part of the
// call, and it follows the caller's context only when that context can be
// canceled. net/http's Transport derives its own context from it through
// its AfterFunc method. Measured with BenchmarkPostOverhead (an in-memory
// transport), it and the Client's one timer for all attempt timeouts took a
// call from 25 allocations to 18 (a bare http.Client makes 12); over
// loopback the call got about 4% faster (TestPostRatio with -client.ratio).
type attemptCtx struct {
	parent context.Context // the caller's
	call   *call
	timed  bool // has an attempt timeout: else all but Value is the parent's

	mu       sync.Mutex
	done     chan struct{} // made on demand
	err      error
	timeout  bool         // canceled by the attempt timeout
	funcs    []afterFunc  // to run when canceled
	inline   [1]afterFunc // funcs' first storage
	nextID   uint64
	unfollow func() bool // stops following the parent

	// Guarded by the Client's attemptTimeouts.
	queued, expired bool
	deadline        time.Time
	prev, next      *attemptCtx
}

type afterFunc struct {
	id uint64
	f  func()
}

type attemptKey struct{}

func (a *attemptCtx) init(parent context.Context, c *call, timeout, wait time.Duration) {
	a.parent, a.call = parent, c
	a.funcs = a.inline[:0]
	if timeout <= 0 {
		return
	}
	if deadline, ok := parent.Deadline(); ok && time.Until(deadline)-wait <= timeout {
		return
	}
	a.timed = true
}

// attemptOf returns the attemptCtx that ctx is or derives from, or nil.
func attemptOf(ctx context.Context) *attemptCtx {
	if a, ok := ctx.(*attemptCtx); ok {
		return a
	}
	a, _ := ctx.Value(attemptKey{}).(*attemptCtx)
	return a
}

func (a *attemptCtx) Deadline() (time.Time, bool) { return a.parent.Deadline() }

func (a *attemptCtx) Value(key any) any {
	switch key.(type) {
	case callKey:
		return a.call
	case attemptKey:
		return a
	}
	return a.parent.Value(key)
}

func (a *attemptCtx) Done() <-chan struct{} {
	if !a.timed {
		return a.parent.Done()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		a.done = make(chan struct{})
	}
	a.followLocked()
	return a.done
}

func (a *attemptCtx) Err() error {
	if !a.timed {
		return a.parent.Err()
	}
	a.mu.Lock()
	err := a.err
	a.mu.Unlock()
	if err == nil {
		if err = a.parent.Err(); err != nil {
			// Not waiting for the parent's AfterFunc to tell.
			a.cancel(err, false)
		}
	}
	return err
}

// AfterFunc arranges for f to run in its own goroutine when a is canceled,
// as context.AfterFunc does; the context package uses it to make the
// contexts derived from a follow it.
func (a *attemptCtx) AfterFunc(f func()) (stop func() bool) {
	if !a.timed {
		return context.AfterFunc(a.parent, f)
	}
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a.followLocked()
	a.nextID++
	id := a.nextID
	a.funcs = append(a.funcs, afterFunc{id: id, f: f})
	a.mu.Unlock()
	return func() bool { return a.stop(id) }
}

func (a *attemptCtx) stop(id uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, af := range a.funcs {
		if af.id == id {
			a.funcs = append(a.funcs[:i], a.funcs[i+1:]...)
			return true
		}
	}
	return false
}

// followLocked makes a follow its parent's cancellation, if the parent can
// be canceled and a does not follow it already.
func (a *attemptCtx) followLocked() {
	if a.unfollow != nil || a.err != nil || a.parent.Done() == nil {
		return
	}
	a.unfollow = context.AfterFunc(a.parent, a.parentDone)
}

func (a *attemptCtx) parentDone() {
	a.cancel(a.parent.Err(), false)
}

// linked reports whether a follows its parent.
func (a *attemptCtx) linked() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unfollow != nil
}

// unlink stops a from following its parent. A later Done or AfterFunc
// follows it again, as the next hop of a redirect does.
func (a *attemptCtx) unlink() {
	a.mu.Lock()
	stop := a.unfollow
	a.unfollow = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// cancel cancels a with err, and runs the functions given to AfterFunc.
func (a *attemptCtx) cancel(err error, timeout bool) {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return
	}
	a.err, a.timeout = err, timeout
	if a.done == nil {
		a.done = make(chan struct{})
	}
	close(a.done)
	funcs := a.funcs
	a.funcs = nil
	stop := a.unfollow
	a.unfollow = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
	for _, af := range funcs {
		go af.f()
	}
}

// timedOut reports whether the attempt timeout canceled a.
func (a *attemptCtx) timedOut() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.timeout
}
