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
	"sync"
	"time"

	"github.com/idemkit/idempotency/internal/keyfield"
)

// Middleware honours the Idempotency-Key header in front of an http.Handler.
// Create one with New and wrap handlers with its Handler method. It is
// immutable and safe for concurrent use.
type Middleware struct {
	store      Store
	binder     Binder
	cfg        config
	replayable map[string]struct{} // cfg.replayHeaders
}

// New returns middleware that protects requests with store. The options are
// checked: an invalid one is an error.
func New(store Store, opts ...Option) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("server: New needs a Store")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Middleware{store: store, cfg: cfg, replayable: make(map[string]struct{}, len(cfg.replayHeaders))}
	for _, name := range cfg.replayHeaders {
		m.replayable[name] = struct{}{}
	}
	m.binder, _ = store.(Binder)
	return m, nil
}

// Handler wraps next. Its shape, func(http.Handler) http.Handler, is the one
// routers such as chi take for middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// Lease describes the lease a protected handler runs under. The handler can
// pass its Token to downstream systems so that they refuse writes from a
// holder whose lease was lost.
type Lease struct {
	ID
	Token Token
}

type leaseKey struct{}

// LeaseFromContext returns the lease of the request being handled, if the
// middleware protects it.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	if !ok {
		return Lease{}, false
	}
	return *l, true
}

func (m *Middleware) protects(method string) bool {
	for _, p := range m.cfg.methods {
		if p == method {
			return true
		}
	}
	return false
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.protects(r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header[m.cfg.header]
	if len(values) == 0 {
		if m.cfg.optional {
			next.ServeHTTP(w, r)
			return
		}
		m.refuse(w, r, newError(http.StatusBadRequest, ErrMissingKey, "ErrMissingKey",
			"Idempotency key missing", "This request requires the "+m.cfg.header+" header."))
		return
	}
	if len(values) > 1 {
		m.refuse(w, r, newError(http.StatusBadRequest, ErrInvalidKey, "ErrInvalidKey",
			"Idempotency key invalid", "The "+m.cfg.header+" header appears more than once."))
		return
	}
	key, err := keyfield.Parse(values[0])
	if err != nil {
		m.refuse(w, r, newError(http.StatusBadRequest, ErrInvalidKey, "ErrInvalidKey",
			"Idempotency key invalid", "The "+m.cfg.header+" header is invalid: "+err.Error()+"."))
		return
	}
	body, err := m.readBody(r)
	if err != nil {
		if errors.Is(err, ErrBodyTooLarge) {
			m.refuse(w, r, newError(http.StatusRequestEntityTooLarge, ErrBodyTooLarge, "ErrBodyTooLarge",
				"Request body too large", "The request body is larger than "+strconv.FormatInt(m.cfg.maxBody, 10)+" bytes."))
		}
		// Otherwise the body could not be read: the client is gone.
		return
	}
	scope, err := m.cfg.scope(r)
	if err != nil {
		m.refuse(w, r, &Error{Status: http.StatusBadRequest, Type: problemBase + "ErrUnidentified",
			Title: "Request not identified", Detail: "The caller of this request could not be identified.",
			kind: ErrUnidentified, cause: err})
		return
	}
	fp, err := m.cfg.fingerprint(r, body)
	if err != nil {
		m.refuse(w, r, &Error{Status: http.StatusBadRequest, Type: problemBase + "ErrUnidentified",
			Title: "Request not identified", Detail: "This request could not be fingerprinted.",
			kind: ErrUnidentified, cause: err})
		return
	}
	ex := &exchange{m: m, w: w, r: r, next: next, body: body, fp: fp}
	ex.lease.ID = ID{Scope: scope, Key: key}
	ex.handle()
}

// ErrUnidentified: the scope or fingerprint function failed, so the request
// could not be identified (400).
var ErrUnidentified = errors.New("request could not be identified")

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, e *Error) {
	m.cfg.errorWriter(w, r, e)
}

// readBody reads the whole request body, up to the limit.
func (m *Middleware) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > m.cfg.maxBody {
		return nil, ErrBodyTooLarge
	}
	if r.ContentLength > 0 {
		buf := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.maxBody+1))
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) > m.cfg.maxBody {
		return nil, ErrBodyTooLarge
	}
	return buf, nil
}

// exchange is one protected request, from its claim to its answer. It holds
// everything the request needs in one allocation.
type exchange struct {
	m     *Middleware
	w     http.ResponseWriter
	r     *http.Request
	next  http.Handler
	body  []byte
	fp    string
	lease Lease
	rec   recorder
	rn    renewal
	br    bodyReader
	lctx  leaseContext
	sctx  detached
}

// bodyReader gives the handler the body the middleware read.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

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

func (ex *exchange) handle() {
	m, r := ex.m, ex.r
	c, err := m.store.Claim(r.Context(), ex.lease.ID, ex.fp, m.cfg.lease, m.cfg.ttl)
	if err == nil && c.Status == InFlight && sameRequest(c, ex.fp) && m.cfg.wait > 0 {
		c, err = ex.await(c)
	}
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone; nothing ran
		}
		ex.storeFailed(err)
		return
	}
	switch c.Status {
	case Acquired:
		ex.lease.Token = c.Token
		ex.run()
	case Completed:
		if c.Fingerprint != ex.fp {
			ex.mismatch()
			return
		}
		ex.replay(c.Response)
	case InFlight:
		if c.Fingerprint != "" && c.Fingerprint != ex.fp {
			ex.mismatch()
			return
		}
		e := newError(http.StatusConflict, ErrInFlight, "ErrInFlight", "Request in flight",
			"A request with this idempotency key is still being processed; retry later.")
		e.RetryAfter = max(c.RetryAfter, time.Second)
		m.refuse(ex.w, r, e)
	default:
		ex.storeFailed(fmt.Errorf("server: Claim returned status %d", c.Status))
	}
}

// await claims again until the request in flight finishes or the wait ends.
func (ex *exchange) await(c Claim) (Claim, error) {
	m, ctx := ex.m, ex.r.Context()
	deadline := time.Now().Add(m.cfg.wait)
	step := 10 * time.Millisecond
	var timer *time.Timer
	for c.Status == InFlight && sameRequest(c, ex.fp) {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		d := min(step, c.RetryAfter+time.Millisecond, left)
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
		c, err = m.store.Claim(ctx, ex.lease.ID, ex.fp, m.cfg.lease, m.cfg.ttl)
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
		ex.r.Body = ex.bodyReader()
		ex.next.ServeHTTP(ex.w, ex.r)
		return
	}
	m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotency store failed; request refused",
		slog.String("key", ex.lease.Key), slog.Any("error", err))
	ex.unavailable(err)
}

// unavailable answers 503: the request was not (or may not have been)
// processed, and a retry is safe.
func (ex *exchange) unavailable(err error) {
	e := newError(http.StatusServiceUnavailable, ErrStoreUnavailable, "ErrStoreUnavailable",
		"Idempotency store unavailable", "The request could not be protected against duplicates, so it was not processed; retry later.")
	e.RetryAfter = time.Second
	e.cause = err
	ex.m.refuse(ex.w, ex.r, e)
}

func (ex *exchange) mismatch() {
	ex.m.refuse(ex.w, ex.r, newError(http.StatusUnprocessableEntity, ErrKeyMismatch, "ErrKeyMismatch",
		"Idempotency key reused", "This idempotency key was already used for a different request."))
}

func (ex *exchange) bodyReader() io.ReadCloser {
	if ex.body == nil {
		return http.NoBody
	}
	ex.br.Reset(ex.body)
	return &ex.br
}

// run runs the handler under the lease, then stores its response (or
// releases the claim) before the client sees the response.
func (ex *exchange) run() {
	m := ex.m
	cctx, cancel := context.WithCancelCause(ex.r.Context())
	defer cancel(nil)
	ex.lctx = leaseContext{Context: cctx, lease: &ex.lease}
	var ctx context.Context = &ex.lctx
	if m.binder != nil {
		ctx = m.binder.Bind(ctx, ex.lease.ID, ex.lease.Token)
	}
	r := ex.r.WithContext(ctx)
	r.Body = ex.bodyReader()
	ex.rec = recorder{w: ex.w, limit: m.cfg.maxStored}
	// Only a Binder's Complete can undo the handler's work; keep the
	// headers as they were so that its refusal carries none of the
	// handler's (a cookie, a Location).
	var before http.Header
	if m.binder != nil {
		before = ex.w.Header().Clone()
	}
	ex.rn.start(ex, cancel)

	done := false
	defer func() {
		if !done {
			// The handler panicked: give the key back, and let the
			// panic go on to the server's recovery.
			ex.rn.stop()
			ex.release("handler panicked")
		}
	}()
	ex.next.ServeHTTP(&ex.rec, r)
	done = true
	ex.rn.stop()

	rec := &ex.rec
	status := rec.finalStatus()
	switch {
	case rec.streaming:
		// Already sent, in part or in whole; record that it ran.
		ex.complete(&Response{Status: status, Header: ex.keptHeader(), BodyOmitted: true})
		how := "streamed"
		if rec.hijacked {
			how = "hijacked"
		}
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelInfo, "idempotent response passed through and stored without its body",
			slog.String("key", ex.lease.Key), slog.Int("status", status), slog.String("how", how))
	case !m.cfg.storeStatus(status):
		ex.release("status " + strconv.Itoa(status) + " is not stored")
		rec.send()
	default:
		if err := ex.complete(&Response{Status: status, Header: ex.keptHeader(), Body: rec.body}); errors.Is(err, ErrNotCommitted) {
			// The handler's effects were undone (or may have been):
			// its response must not reach the client.
			h := ex.w.Header()
			clear(h)
			maps.Copy(h, before)
			ex.unavailable(err)
			return
		}
		rec.send()
	}
}

// storeContext is for writes that must happen even when the client has gone:
// a dropped connection is exactly when the retry will come. The handler's
// goroutine makes one such write per exchange.
func (ex *exchange) storeContext() *detached {
	ex.sctx = detached{}
	ex.sctx.init(ex.r.Context(), ex.m.cfg.storeTimeout)
	return &ex.sctx
}

// complete stores the response. An error is logged here; the caller looks
// only for ErrNotCommitted.
func (ex *exchange) complete(resp *Response) error {
	ctx := ex.storeContext()
	defer ctx.stop()
	err := ex.m.store.Complete(ctx, ex.lease.ID, ex.lease.Token, resp, ex.m.cfg.ttl)
	switch {
	case errors.Is(err, ErrNotCommitted):
		ex.m.cfg.logger.LogAttrs(ctx, slog.LevelError, "idempotent request not committed; answering 503",
			slog.String("key", ex.lease.Key), slog.Any("error", err))
	case err != nil:
		ex.m.cfg.logger.LogAttrs(ctx, slog.LevelError, "idempotent response not stored; a retry may run the request again",
			slog.String("key", ex.lease.Key), slog.Any("error", err))
	}
	return err
}

func (ex *exchange) release(why string) {
	ctx := ex.storeContext()
	defer ctx.stop()
	if err := ex.m.store.Release(ctx, ex.lease.ID, ex.lease.Token); err != nil {
		ex.m.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency claim not released; retries get 409 until its lease expires",
			slog.String("key", ex.lease.Key), slog.String("reason", why), slog.Any("error", err))
	}
}

// keptHeader returns the response headers on the replay list, copied so that
// the stored values never share memory with the live response.
func (ex *exchange) keptHeader() http.Header {
	h := ex.w.Header()
	var names [16]string
	kept, n := names[:0], 0
	for name, vs := range h {
		if _, ok := ex.m.replayable[name]; ok && len(vs) > 0 {
			kept = append(kept, name)
			n += len(vs)
		}
	}
	if n == 0 {
		return nil
	}
	values := make([]string, 0, n)
	out := make(http.Header, len(kept))
	for _, name := range kept {
		start := len(values)
		values = append(values, h[name]...)
		out[name] = values[start:len(values):len(values)]
	}
	return out
}

// trueValue is a header value shared by every replay; the full slice
// expression where it is used keeps any writer from appending to it in place.
var trueValue = [1]string{"true"}

// replay answers with a stored response.
func (ex *exchange) replay(resp *Response) {
	h := ex.w.Header()
	for name, vs := range resp.Header {
		// The full slice expression makes any append by a later writer
		// copy, so the stored values are never written to.
		h[name] = vs[:len(vs):len(vs)]
	}
	h[ex.m.cfg.replayHeader] = trueValue[:1:1]
	if resp.BodyOmitted {
		h[HeaderBodyOmitted] = trueValue[:1:1]
	}
	if needsLength(resp.Status, len(resp.Body)) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	ex.w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		ex.w.Write(resp.Body)
	}
}

// renewal extends the lease while the handler runs, every third of the lease.
// It runs on a timer, not a goroutine of its own; stop waits for a renewal in
// progress, so none happens after the handler has finished.
type renewal struct {
	ex      *exchange
	cancel  context.CancelCauseFunc
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

func (rn *renewal) start(ex *exchange, cancel context.CancelCauseFunc) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.ex, rn.cancel = ex, cancel
	rn.timer = time.AfterFunc(ex.m.cfg.lease/3, rn.renew)
}

func (rn *renewal) renew() {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.stopped {
		return
	}
	ex := rn.ex
	ctx := new(detached)
	ctx.init(ex.r.Context(), ex.m.cfg.storeTimeout)
	err := ex.m.store.Extend(ctx, ex.lease.ID, ex.lease.Token, ex.m.cfg.lease)
	ctx.stop()
	switch {
	case errors.Is(err, ErrLeaseLost):
		ex.m.cfg.logger.LogAttrs(ctx, slog.LevelError, "idempotency lease lost while the handler ran; cancelling it",
			slog.String("key", ex.lease.Key))
		rn.cancel(err)
		return
	case err != nil:
		ex.m.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency lease not renewed; will try again",
			slog.String("key", ex.lease.Key), slog.Any("error", err))
	}
	rn.timer.Reset(ex.m.cfg.lease / 3)
}

func (rn *renewal) stop() {
	rn.mu.Lock()
	rn.stopped = true
	rn.timer.Stop()
	rn.mu.Unlock()
}
