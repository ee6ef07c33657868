package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/internal/incoming"
)

// exchange is one protected request, from its claim to its answer. It holds
// everything the request needs in one allocation.
type exchange struct {
	m           *Middleware
	w           http.ResponseWriter
	r           *http.Request
	next        http.Handler
	echo        [1]string // the key header's value on the response
	body        []byte    // the whole request body, read before the claim
	fingerprint string
	lease       Lease
	incoming    incoming.Key // the handler's incoming key, for the client
	// claimed is when the Claim that acquired the lease was sent: the
	// store's lease cannot have begun earlier.
	claimed    time.Time
	claimCtx   detached      // the first Claim's context
	storeCtx   detached      // the context of the write after the handler
	acquired   bool          // the claim acquired the key
	timing     timing        // for the observer, if there is one
	capture    recorder      // the handler's response, kept until stored
	renewal    renewal       // keeps the lease alive
	bodyReader bodyReader    // the handler's r.Body, over body
	kept       *keptResponse // the fingerprint, and room for the response
	handlerCtx leaseContext  // the handler's context
	// inline holds a small request body, so that reading one allocates
	// nothing of its own. Nothing stored refers to it: the store keeps
	// the body's fingerprint, never the body.
	inline [inlineBody]byte
}

// inlineBody is the largest request body (less one byte, read to see its
// end) that the exchange holds in its own allocation.
const inlineBody = 2048

// bodyReader gives the handler the body the middleware read.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

func (ex *exchange) handle() {
	m, r := ex.m, ex.r
	c, err := ex.claim()
	if err == nil && c.Status == InFlight && sameRequest(c, ex.fingerprint) && m.cfg.wait > 0 {
		c, err = ex.await(c)
	}
	ex.timing.claimed(m)
	if err != nil {
		if r.Context().Err() != nil {
			// The client is gone; nothing ran.
			ex.emit(EventClientGone, 0, err)
			return
		}
		ex.storeFailed(err)
		return
	}
	switch c.Status {
	case Acquired:
		ex.lease.Token, ex.lease.Abandoned = c.Token, c.Abandoned
		ex.acquire()
		if c.Abandoned > 0 && m.cfg.abandoned == RefuseAbandoned {
			ex.outcomeUnknown()
			return
		}
		if r.Context().Err() != nil {
			// The client left while the claim was made: nothing has
			// run, so give the key back rather than leave it in flight.
			ex.release("the client went away before the handler ran")
			ex.emit(EventClientGone, 0, nil)
			return
		}
		ex.run()
	case Completed:
		if c.Response == nil {
			// A broken Store: fail closed, as for any store failure.
			ex.storeFailed(errors.New("server: Claim returned a completed record without its response"))
			return
		}
		if c.Fingerprint != ex.fingerprint {
			ex.mismatch()
			return
		}
		ex.replay(c.Response)
		ex.emit(EventReplayed, c.Response.Status, nil)
	case InFlight:
		if c.Fingerprint != "" && c.Fingerprint != ex.fingerprint {
			ex.mismatch()
			return
		}
		e := problem(ErrInFlight, "A request with this idempotency key is still being processed; retry later.", nil)
		e.RetryAfter = m.cfg.retryAfter
		if c.RetryAfter > 0 {
			// Never longer than the holder's lease has left: by then
			// the retry either gets the answer or takes the key over.
			e.RetryAfter = min(e.RetryAfter, c.RetryAfter)
		}
		m.refuse(ex.w, r, e)
		ex.emit(EventInFlight, e.Status, nil)
	default:
		ex.storeFailed(fmt.Errorf("server: Claim returned status %d", c.Status))
	}
}

// claim asks the store for the lease, within the store timeout. Its context
// ignores the client's disconnect, so that the answer is known: a claim
// abandoned half-way could leave the key in flight until its lease ended.
func (ex *exchange) claim() (Claim, error) {
	m := ex.m
	var ctx *detached
	if ex.claimCtx.values == nil {
		// The first claim's context lives in the exchange: one allocation
		// fewer on every request. It is never reused.
		ctx = &ex.claimCtx
		ctx.init(ex.r.Context(), m.claimTimeout())
	} else {
		ctx = ex.storeContext(m.claimTimeout())
	}
	defer ctx.stop()
	ex.claimed = time.Now()
	return m.store.Claim(ctx, ex.lease.ID, ex.fingerprint, m.cfg.lease, m.cfg.ttl)
}

// claimTimeout bounds a Claim: by the store timeout, and by the lease less
// its margin, since a lease granted by an answer that comes later is too
// short to run the handler under.
func (m *Middleware) claimTimeout() time.Duration {
	return min(m.cfg.storeTimeout, m.cfg.lease-leaseMargin(m.cfg.lease))
}

// await claims again until the request in flight finishes or the wait ends.
func (ex *exchange) await(c Claim) (Claim, error) {
	m, ctx := ex.m, ex.r.Context()
	deadline := time.Now().Add(m.cfg.wait)
	step := 10 * time.Millisecond
	var timer *time.Timer
	for c.Status == InFlight && sameRequest(c, ex.fingerprint) {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		// A millisecond at least: a store whose clock is behind can
		// report a lease with negative time left, and a timer of no
		// length would ask it again at once, for the whole wait.
		d := min(step, addDur(max(c.RetryAfter, 0), time.Millisecond), left)
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return c, ctx.Err()
		case <-timer.C:
		}
		step = min(2*step, 250*time.Millisecond)
		var err error
		c, err = ex.claim()
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// sameRequest reports whether an in-flight claim is for the request with
// fingerprint fp, as far as the store can tell.
func sameRequest(c Claim, fp string) bool {
	return c.Fingerprint == "" || c.Fingerprint == fp
}

func (ex *exchange) storeFailed(err error) {
	m := ex.m
	if m.cfg.failOpen {
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotency store failed; running unprotected",
			slog.String("key", ex.lease.Key), slog.Any("error", err))
		ex.r.Body = ex.requestBody()
		ex.next.ServeHTTP(ex.w, ex.r)
		ex.emit(EventUnprotected, 0, err)
		return
	}
	m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotency store failed; request refused",
		slog.String("key", ex.lease.Key), slog.Any("error", err))
	ex.unavailable(err)
}

// unavailable answers 503: the request was not (or may not have been)
// processed, and a retry is safe.
func (ex *exchange) unavailable(err error) {
	e := problem(ErrStoreUnavailable, "The request could not be protected against duplicates, so it was not processed; retry later.", err)
	e.RetryAfter = ex.m.cfg.retryAfter
	// Deferred, so that the request ends for the observer even if the
	// ErrorWriter panics: this may come after the key was acquired and
	// released, and an observer counting the claims in flight must see
	// it end.
	defer ex.emit(EventUnavailable, e.Status, err)
	ex.m.refuse(ex.w, ex.r, e)
}

func (ex *exchange) mismatch() {
	e := problem(ErrKeyMismatch, "This idempotency key was already used for a different request.", nil)
	ex.m.refuse(ex.w, ex.r, e)
	ex.emit(EventMismatch, e.Status, nil)
}

func (ex *exchange) requestBody() io.ReadCloser {
	if ex.body == nil {
		return http.NoBody
	}
	ex.bodyReader.Reset(ex.body)
	return &ex.bodyReader
}

// run runs the handler under the lease, then stores its response (or
// releases the claim) before the client sees the response.
func (ex *exchange) run() {
	m := ex.m
	cctx, cancel := context.WithCancelCause(ex.r.Context())
	defer cancel(nil)
	ex.incoming = incoming.Key{Scope: ex.lease.Scope, Key: ex.lease.Key}
	ex.handlerCtx = leaseContext{Context: cctx, lease: &ex.lease, in: &ex.incoming}
	var ctx context.Context = &ex.handlerCtx
	if m.binder != nil {
		ctx = m.binder.Bind(ctx, ex.lease.ID, ex.lease.Token)
	}
	r := ex.r.WithContext(ctx)
	r.Body = ex.requestBody()
	ex.capture = recorder{w: ex.w, limit: m.cfg.maxStored}
	// Only a Binder's Complete can undo the handler's work; keep the
	// headers as they were so that its refusal carries none of the
	// handler's (a cookie, a Location).
	var before http.Header
	if m.binder != nil {
		before = ex.w.Header().Clone()
	}
	// The lease is renewed until the response is stored or the claim
	// released, not only while the handler runs: a retry must not take
	// the key over while the outcome is being written.
	if !ex.renewal.start(ex, cancel) {
		// The Claim's answer came too late: the lease it granted is
		// over, or nearly, and another request may take the key over
		// and run. The handler must not run at the same time.
		ex.release("the claim was answered too late to run the handler")
		ex.m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelWarn, "idempotency claim answered after its lease ended, or nearly; handler not run, answering 503",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Duration("claim", time.Since(ex.claimed)))
		ex.unavailable(errClaimTooLate)
		return
	}
	renewing := true
	defer func() {
		if renewing {
			ex.renewal.stop()
		}
	}()

	done := false
	defer func() {
		if !done {
			// The handler panicked: give the key back, and let the
			// panic go on to the server's recovery.
			ex.timing.handled(m)
			ex.release("handler panicked")
			ex.emit(EventReleased, 0, nil)
		}
	}()
	ex.next.ServeHTTP(&ex.capture, r)
	done = true
	ex.capture.returned()
	ex.timing.handled(m)

	rec := &ex.capture
	status := rec.finalStatus()
	switch {
	case !rec.wrote() && cctx.Err() != nil:
		// The handler gave up without an answer because its context
		// ended: the client went away, or the lease could not be kept.
		// An empty 200 stored now would be replayed for the whole TTL.
		cause := context.Cause(cctx)
		ex.release("the handler returned without an answer after its context ended: " + cause.Error())
		if ex.r.Context().Err() == nil {
			rec.restoreDeadline()
			ex.unavailable(cause)
			return
		}
		ex.emit(EventReleased, 0, cause)
	case !m.storeStatus(ex.r.Context(), status):
		// Whatever its size, and even if part of it has gone out: a
		// status that says "retry" must let the retry run.
		ex.release("status " + strconv.Itoa(status) + " is not stored")
		if !rec.streaming {
			rec.send()
		}
		ex.emit(EventReleased, status, nil)
	case rec.streaming:
		// Already sent, in part or in whole; record that it ran.
		how := "streamed"
		if rec.hijacked {
			how = "hijacked"
		}
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelInfo, "idempotent response passed through; storing it without its body",
			slog.String("key", ex.lease.Key), slog.Int("status", status), slog.String("how", how))
		resp := ex.response(status, nil, true)
		err := ex.complete(resp)
		if storeLater(err) {
			renewing = !ex.storeAfterSend(resp, err, true)
			return
		}
		ex.completed(status, err)
	default:
		resp := ex.response(status, rec.body, false)
		err := ex.complete(resp)
		if errors.Is(err, ErrNotCommitted) {
			// The handler's effects were undone (or may have been):
			// its response must not reach the client.
			h := ex.w.Header()
			clear(h)
			maps.Copy(h, before)
			rec.restoreDeadline()
			ex.unavailable(err)
			return
		}
		if storeLater(err) {
			// Not stored within the store timeout: the effect
			// happened once, and the client is told what it was now;
			// then the response is stored as soon as the store
			// answers, so that a retry gets it replayed.
			renewing = !ex.storeAfterSend(resp, err, false)
			return
		}
		rec.send()
		ex.completed(status, err)
	}
}

// storeLater reports whether a Complete that failed with err should be tried
// again after the response is sent: the store failed, rather than refused.
func storeLater(err error) bool {
	return err != nil && !final(err)
}

// final reports whether a store write that failed with err cannot succeed
// if tried again.
func final(err error) bool {
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotCommitted) ||
		errors.Is(err, ErrNotStorable) || errors.Is(err, ErrStoreClosed)
}

// completed reports the outcome of a response sent after Complete.
func (ex *exchange) completed(status int, err error) {
	if err != nil {
		ex.emit(EventNotStored, status, err)
		return
	}
	ex.emit(EventExecuted, status, nil)
}

// storeContext is for store calls that must finish even when the client has
// gone: a dropped connection is exactly when the retry will come. Each call
// has a context of its own: a Store may leave a goroutine watching the last
// one for a while after it returned (a context derived from it, whose
// cancellation propagates asynchronously).
func (ex *exchange) storeContext(timeout time.Duration) *detached {
	ctx := new(detached)
	ctx.init(ex.r.Context(), timeout)
	return ctx
}

// retryStore stores resp with Complete, or, if resp is nil, gives the key
// back with Release, trying until the call succeeds, fails for good, or the
// store timeout ends. ErrLeaseLost and ErrNotCommitted are final: trying
// again cannot change them.
func (ex *exchange) retryStore(resp *Response) error {
	m := ex.m
	var ctx *detached
	if ex.storeCtx.values == nil {
		// The exchange's one write after the handler: its context lives
		// in the exchange, like the first Claim's, and is never reused.
		ctx = &ex.storeCtx
		ctx.init(ex.r.Context(), m.cfg.storeTimeout)
	} else {
		ctx = ex.storeContext(m.cfg.storeTimeout)
	}
	defer ctx.stop()
	var timer *time.Timer
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		var err error
		if resp != nil {
			err = m.store.Complete(ctx, ex.lease.ID, ex.lease.Token, resp, m.cfg.ttl)
		} else {
			err = m.store.Release(ctx, ex.lease.ID, ex.lease.Token)
		}
		if err == nil || final(err) {
			return err
		}
		left := time.Until(ctx.deadline)
		if left <= wait {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		<-timer.C
	}
}

// complete stores the response, retrying within the store timeout while the
// lease is kept alive. An error is logged here; the caller looks only for
// ErrNotCommitted.
func (ex *exchange) complete(resp *Response) error {
	m := ex.m
	err := ex.completeOrOmit(resp, ex.retryStore)
	ex.timing.stored(m)
	switch {
	case err == nil:
	case errors.Is(err, ErrNotCommitted):
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotent request not committed; answering 503",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	case errors.Is(err, ErrStoreClosed):
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelWarn, "idempotent response not stored: the store was closed",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	case errors.Is(err, ErrNotStorable):
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotent response refused by the store even without its body; sending it, and the key stays in flight until its lease ends",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	case errors.Is(err, ErrLeaseLost):
		// Either a try whose answer was lost stored it, or the lease
		// was lost to a retry.
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelWarn, "idempotent response not stored by this holder: stored by an earlier try whose answer was lost, or the lease was lost",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	default:
		// The response goes to the client anyway, the key stays
		// claimed, and completeLater goes on trying.
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotent response not stored within the store timeout; sending it, and storing it when the store answers",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	}
	return err
}

func (ex *exchange) release(why string) {
	m := ex.m
	err := ex.retryStore(nil)
	ex.timing.stored(m)
	if err != nil {
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelWarn, "idempotency claim not released; retries get 409 until its lease expires",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.String("reason", why), slog.Any("error", err))
	}
}
