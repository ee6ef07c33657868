package engine

import (
	"context"
	"slices"
	"sync"
	"time"
)

// detached is the context of the store writes that follow a handler: it
// keeps the request's values but not its cancellation (a dropped connection
// is exactly when the retry will come), and it ends at a deadline.
//
// It is context.WithTimeout(context.WithoutCancel(ctx), d) without their
// allocations on the common path: its Done channel and timer are made only
// when a Store asks for them, which an in-memory store never does (a Redis
// client does). BenchmarkMiddleware (go test -run '^$' -bench
// BenchmarkMiddleware -benchmem ./server/) counts the allocations per
// request; BENCHMARKS.md records them, so that this comment does not go
// stale as the path changes.
//
// A detached context is used for one store call and never reused: a Store
// may leave a goroutine watching it for a moment after it returned.
//
// It has an AfterFunc method, which context.AfterFunc uses instead of
// starting a goroutine to wait on Done: pgx bounds every query by its
// context so, and each query of a store call would otherwise start one.
type detached struct {
	values   context.Context
	deadline time.Time

	mu     sync.Mutex
	done   chan struct{} // made by the first Done
	timer  *time.Timer
	closed bool // done is closed
	// after holds the functions that AfterFunc registered and that have
	// neither run nor been stopped; afterSeq numbers them.
	after    []afterEntry
	afterSeq uint64
	// afterInline holds the first of them: a store call registers one
	// at a time.
	afterInline [1]afterEntry
}

// afterEntry is a function registered by AfterFunc.
type afterEntry struct {
	seq uint64
	f   func()
}

var _ context.Context = (*detached)(nil)

func (d *detached) init(values context.Context, timeout time.Duration) {
	d.values = values
	d.deadline = time.Now().Add(timeout)
}

func (d *detached) Deadline() (time.Time, bool) { return d.deadline, true }

func (d *detached) Value(key any) any { return d.values.Value(key) }

func (d *detached) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.doneLocked()
}

// doneLocked makes the Done channel and its timer, once. d.mu is held.
func (d *detached) doneLocked() chan struct{} {
	if d.done == nil {
		d.done = make(chan struct{})
		if left := time.Until(d.deadline); left > 0 {
			d.timer = time.AfterFunc(left, d.expire)
		} else {
			d.closed = true
			close(d.done)
		}
	}
	return d.done
}

func (d *detached) expire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return // expireNow came first
	}
	d.end()
}

// end closes Done and runs each function that AfterFunc registered on a
// goroutine of its own, as context.AfterFunc does. d.mu is held.
func (d *detached) end() {
	d.closed = true
	close(d.done)
	for _, a := range d.after {
		go a.f()
	}
	d.after = nil
}

// AfterFunc arranges for f to run on a goroutine of its own once d is done,
// at once if it is done already, as context.AfterFunc does; stop unregisters
// f, and reports whether that kept it from running. context.AfterFunc calls
// this method rather than start a goroutine to wait for Done.
func (d *detached) AfterFunc(f func()) (stop func() bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.doneLocked()
	if d.closed {
		go f()
		return func() bool { return false }
	}
	d.afterSeq++
	seq := d.afterSeq
	if d.after == nil {
		d.after = d.afterInline[:0]
	}
	d.after = append(d.after, afterEntry{seq: seq, f: f})
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		for i, a := range d.after {
			if a.seq == seq {
				d.after = slices.Delete(d.after, i, i+1)
				return true
			}
		}
		return false
	}
}

// Err follows Done once Done has been asked for, and the clock before that.
func (d *detached) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done != nil && !d.closed {
		return nil
	}
	if d.closed || !time.Now().Before(d.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// expireNow ends d at once, as if its deadline had passed.
func (d *detached) expireNow() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if d.done == nil {
		d.done = make(chan struct{})
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	d.end()
}

// stop releases the timer, if one was made. d must not be used afterwards.
func (d *detached) stop() {
	d.mu.Lock()
	if d.timer != nil {
		d.timer.Stop()
	}
	d.mu.Unlock()
}
