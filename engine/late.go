package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Bounds of the late Completes in progress: beyond either, a late Complete
// runs on the request's goroutine instead (see lateWork).
const (
	maxLate      = 1024
	maxLateBytes = 64 << 20
)

// lateWork owns the goroutines that store a result after it was answered:
// the late Completes. A late Complete runs on a goroutine of its own, not the
// call's, so that neither the caller's answer nor its next request on the
// same connection waits for the store, whatever wraps the door (a writer
// that cannot flush, http.TimeoutHandler). They are bounded in number
// (maxLate) and in the memory their results hold (maxLateBytes); beyond
// either bound, and after Shutdown, a late Complete runs on the call's
// goroutine, after an answer that the door sends at once (Door.Send with
// now), and says so in the log: the result is still stored, so nothing runs
// twice.
type lateWork struct {
	mu     sync.Mutex
	n      int // goroutines running
	bytes  int // the sizes of their responses
	closed bool
	ctx    context.Context // cancelled when Shutdown gives up
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// base returns the context that Shutdown cancels when it gives up. l.mu is
// held.
func (l *lateWork) base() context.Context {
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancel(context.Background())
	}
	return l.ctx
}

// reserve takes a place for a late Complete of size bytes on a goroutine of
// its own, and reports whether there was one. The context it returns is the
// one Shutdown cancels when it gives up; without a place, the late Complete
// belongs to its request, and its context is not Shutdown's.
func (l *lateWork) reserve(size int) (context.Context, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx := l.base()
	if l.closed || l.n >= maxLate || l.bytes+size > maxLateBytes {
		return context.Background(), false
	}
	l.n++
	l.bytes += size
	l.wg.Add(1)
	return ctx, true
}

func (l *lateWork) done(size int) {
	l.mu.Lock()
	l.n--
	l.bytes -= size
	l.mu.Unlock()
	l.wg.Done()
}

// Shutdown waits for the results that are being stored after they were
// answered (a Complete that failed within the store timeout goes on being
// tried in the background, for one lease at most, and so does a Release)
// and returns nil once they are all stored or given up; if ctx ends first,
// it stops them, waits for them to return, and returns ctx's error: their
// keys stay in flight until their leases end, and a retry after that runs
// the work again.
//
// Call it once no call is still in the engine (after http.Server.Shutdown
// has returned, for the HTTP middleware). After Shutdown, the engine goes on
// running calls, but a late Complete runs on its call's goroutine, as it
// does beyond 1024 late Completes at once or 64 MiB of their results.
// Shutdown may be called more than once.
func (e *Engine) Shutdown(ctx context.Context) error {
	l := &e.late
	l.mu.Lock()
	l.closed = true
	base, cancel := l.base(), l.cancel
	l.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
		return nil
	case <-base.Done():
		// An earlier Shutdown gave up.
	case <-ctx.Done():
	}
	cancel()
	<-idle
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("engine: shutdown: %w", err)
	}
	return nil
}

// storeAfterSend answers the caller with the result, unless it went out
// already (sent), and stores resp after it, for a Complete that failed
// within the store timeout: the effect happened once, and the caller is
// told what it was now. Unless the bounds are reached, the store write goes
// on a goroutine that the Engine owns, which also owns the lease's renewal
// from then on (Call.renewalHandedOff).
func (c *Call) storeAfterSend(resp *Response, status int, firstErr error, sent bool) {
	e := c.e
	size := resp.Size()
	base, ok := e.late.reserve(size)
	if !ok {
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotent response stored after it was answered, on the call's goroutine: too many being stored, or the engine was shut down",
			slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope))
		if !sent {
			c.door.Send(true)
		}
		c.emit(EventNotStored, status, firstErr)
		c.completeLater(base, resp)
		return
	}
	if !sent {
		c.door.Send(false)
	}
	c.emit(EventNotStored, status, firstErr)
	c.renewalHandedOff = true
	go func() {
		defer e.late.done(size)
		defer c.renewal.stop()
		c.completeLater(base, resp)
	}()
}

// lateContext is the context of a late write: the request's values, the
// store timeout, and the cancellation of a Shutdown that gave up.
type lateContext struct {
	context.Context
	values context.Context
}

func (c lateContext) Value(key any) any { return c.values.Value(key) }

// completeLater keeps trying to store resp after it was sent, for one lease
// length at most: until the store takes it, or refuses it (a retry took the
// key over after the lease ended, or a transaction ended), or the store is
// closed, or Shutdown gives up (base is done). Fencing makes a try after a
// takeover harmless. A response stored late is replayed to the retries that
// come after; until then they get 409.
//
// The TTL does not bound it: the record in flight outlives the lease,
// which the renewal keeps, by the TTL.
func (c *Call) completeLater(base context.Context, resp *Response) {
	e := c.e
	tries, err := c.retryLater(base, func() error {
		return c.completeOrOmit(resp, func(resp *Response) error {
			ctx, cancel := c.lateStoreContext(base)
			defer cancel()
			return e.store.Complete(ctx, c.lease.ID, c.lease.Token, resp, e.cfg.TTL)
		})
	})
	attrs := []slog.Attr{slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Int("tries", tries)}
	log := func(level slog.Level, msg string, more ...slog.Attr) {
		e.cfg.Logger.LogAttrs(c.ctx, level, msg, append(attrs, more...)...)
	}
	switch {
	case err == nil:
		log(slog.LevelWarn, "idempotent response stored after it was sent")
	case errors.Is(err, ErrLeaseLost):
		// After tries that failed, this is ambiguous: one of them may
		// have been stored with its answer lost, or a retry took the
		// key over.
		log(slog.LevelWarn, "idempotent response stored by an earlier try whose answer was lost, or the key was taken over")
	case errors.Is(err, ErrStoreClosed):
		log(slog.LevelWarn, "idempotent response not stored: the store was closed", slog.Any("error", err))
	case base.Err() != nil:
		log(slog.LevelError, "idempotent response not stored: Shutdown gave up; a retry after its lease ends runs the request again")
	default:
		log(slog.LevelError, "idempotent response never stored; a retry after its lease ends runs the request again", slog.Any("error", err))
	}
}

// releaseAfterFailure hands a release that failed within the store timeout
// to a goroutine that the Engine owns, which tries it again (releaseLater)
// and, with renewing, owns the lease's renewal from then on, and reports
// whether it did. Beyond the bounds of lateWork, or after Shutdown, the
// release is not tried again: the key stays in flight until its lease
// ends.
func (c *Call) releaseAfterFailure(renewing bool) bool {
	e := c.e
	base, ok := e.late.reserve(0)
	if !ok {
		return false
	}
	if renewing {
		c.renewalHandedOff = true
	}
	go func() {
		defer e.late.done(0)
		if renewing {
			defer c.renewal.stop()
		}
		c.releaseLater(base)
	}()
	return true
}

// releaseLater keeps trying to release the key, as completeLater stores a
// response: the call did nothing that must be kept, and the store missed
// the release that says so. Until the store takes it, retries are refused
// as in flight (the renewal, if it runs, keeps the lease; so does an
// Extend once the store is back, until someone takes the key over); once
// it does, the next retry runs the work as the caller was told it would,
// rather than being told of an abandoned holder. If the store comes back
// only after the lease has ended, a retry that reaches it first takes the
// key over, and this holder counts as abandoned.
func (c *Call) releaseLater(base context.Context) {
	e := c.e
	tries, err := c.retryLater(base, func() error {
		ctx, cancel := c.lateStoreContext(base)
		defer cancel()
		return e.store.Release(ctx, c.lease.ID, c.lease.Token)
	})
	attrs := []slog.Attr{slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.Int("tries", tries)}
	switch {
	case err == nil:
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency claim released after the store came back", attrs...)
	case errors.Is(err, ErrLeaseLost):
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency claim released by an earlier try whose answer was lost, or the key was taken over", attrs...)
	case errors.Is(err, ErrStoreClosed):
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelWarn, "idempotency claim not released: the store was closed", append(attrs, slog.Any("error", err))...)
	default:
		e.cfg.Logger.LogAttrs(c.ctx, slog.LevelError, "idempotency claim never released; a retry after its lease ends takes it over as from an abandoned holder",
			append(attrs, slog.Any("error", err))...)
	}
}

// lateStoreContext returns the context of one store call of a late write: the
// request's values, the store timeout, and base's cancellation.
func (c *Call) lateStoreContext(base context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(base, c.e.cfg.StoreTimeout)
	return lateContext{ctx, c.ctx}, cancel
}

// retryLater calls write until it succeeds or fails for good (final), for
// one lease length at most, or until base is done (Shutdown gave up), and
// returns how many times it called it and its last error.
func (c *Call) retryLater(base context.Context, write func() error) (tries int, err error) {
	lease := c.e.cfg.Lease
	// Often enough to get in before a retry once the store is back: the
	// lease may have ended meanwhile, and a retry could take the key over.
	longest := min(250*time.Millisecond, lease/10)
	b := newBackoff(min(50*time.Millisecond, longest), longest, addSat(time.Now(), lease), false)
	defer b.stop()
	for b.wait(base.Done()) && base.Err() == nil {
		err = write()
		tries++
		if !storeLater(err) {
			return tries, err
		}
	}
	if base.Err() != nil {
		return tries, base.Err()
	}
	return tries, err
}
