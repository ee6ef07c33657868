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
		// net/http keeps headers under their canonical names: "Etag",
		// not "ETag".
		m.replayable[http.CanonicalHeaderKey(name)] = struct{}{}
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
// middleware protects it. The handler's context is cancelled when the lease
// is lost or ends without renewal; context.Cause then wraps ErrLeaseLost.
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
	if m.cfg.echoKey {
		// A slice of its own: nothing done to the response's headers may
		// reach the request's.
		w.Header()[m.cfg.header] = []string{values[0]}
	}
	body, err := m.readBody(r)
	if err != nil {
		m.bodyFailed(w, r, err)
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

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, e *Error) {
	m.cfg.errorWriter(w, r, e)
}

// bodyFailed answers a request whose body could not be read. Nothing has
// been claimed, so nothing is left behind.
func (m *Middleware) bodyFailed(w http.ResponseWriter, r *http.Request, err error) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		m.refuse(w, r, newError(http.StatusRequestEntityTooLarge, ErrBodyTooLarge, "ErrBodyTooLarge",
			"Request body too large", "The request body is larger than "+strconv.FormatInt(m.cfg.maxBody, 10)+" bytes."))
	case errors.As(err, &tooLarge):
		// A limit set in front of the middleware (http.MaxBytesReader).
		e := newError(http.StatusRequestEntityTooLarge, ErrBodyTooLarge, "ErrBodyTooLarge",
			"Request body too large", "The request body is larger than "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes.")
		e.cause = err
		m.refuse(w, r, e)
	default:
		// Answered even when the request's context is done: net/http
		// cancels it when the connection ends mid-body, yet a client
		// that only closed its sending side still reads the answer, and
		// silence would reach it as an empty 200.
		e := newError(http.StatusBadRequest, ErrBodyUnreadable, "ErrBodyUnreadable",
			"Request body unreadable", "The request body could not be read to its end.")
		e.cause = err
		m.refuse(w, r, e)
	}
}

// bodyChunk is the most that readBody allocates ahead of the bytes that
// arrive: a declared Content-Length is a promise, not a reason to reserve
// memory.
const bodyChunk = 32 << 10

// readBody reads the whole request body, up to the limit. Its buffer grows as
// bytes arrive, so that a client that declares a large body and sends little
// holds little memory.
func (m *Middleware) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	limit := m.cfg.maxBody
	if r.ContentLength > limit {
		return nil, ErrBodyTooLarge
	}
	size := bodyChunk
	if r.ContentLength >= 0 && r.ContentLength < bodyChunk {
		// The whole body, and one byte more to see its end without a
		// second allocation.
		size = int(r.ContentLength) + 1
	}
	buf := make([]byte, 0, min(int64(size), limit+1))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Body.Read(buf[len(buf):min(int64(cap(buf)), limit+1)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, ErrBodyTooLarge
		}
		if err == io.EOF {
			if len(buf) == 0 {
				return nil, nil
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
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
	// claimed is when the Claim that acquired the lease was sent: the
	// store's lease cannot have begun earlier.
	claimed  time.Time
	rec      recorder
	rn       renewal
	br       bodyReader
	lctx     leaseContext
	claimCtx detached
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
	c, err := ex.claim()
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
		if r.Context().Err() != nil {
			// The client left while the claim was made: nothing has
			// run, so give the key back rather than leave it in flight.
			ex.release("the client went away before the handler ran")
			return
		}
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
		e.RetryAfter = m.cfg.retryAfter
		if c.RetryAfter > 0 {
			// Never longer than the holder's lease has left: by then
			// the retry either gets the answer or takes the key over.
			e.RetryAfter = min(e.RetryAfter, c.RetryAfter)
		}
		m.refuse(ex.w, r, e)
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
		ctx.init(ex.r.Context(), m.cfg.storeTimeout)
	} else {
		ctx = ex.storeContext(m.cfg.storeTimeout)
	}
	defer ctx.stop()
	ex.claimed = time.Now()
	return m.store.Claim(ctx, ex.lease.ID, ex.fp, m.cfg.lease, m.cfg.ttl)
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
	e.RetryAfter = ex.m.cfg.retryAfter
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
	// The lease is renewed until the response is stored or the claim
	// released, not only while the handler runs: a retry must not take
	// the key over while the outcome is being written.
	ex.rn.start(ex, cancel)
	defer ex.rn.stop()

	done := false
	defer func() {
		if !done {
			// The handler panicked: give the key back, and let the
			// panic go on to the server's recovery.
			ex.release("handler panicked")
		}
	}()
	ex.next.ServeHTTP(&ex.rec, r)
	done = true

	rec := &ex.rec
	status := rec.finalStatus()
	switch {
	case !rec.wrote() && cctx.Err() != nil:
		// The handler gave up without an answer because its context
		// ended: the client went away, or the lease could not be kept.
		// An empty 200 stored now would be replayed for the whole TTL.
		cause := context.Cause(cctx)
		ex.release("the handler returned without an answer after its context ended: " + cause.Error())
		if ex.r.Context().Err() == nil {
			ex.unavailable(cause)
		}
	case !m.cfg.storeStatus(status):
		// Whatever its size, and even if part of it has gone out: a
		// status that says "retry" must let the retry run.
		ex.release("status " + strconv.Itoa(status) + " is not stored")
		if !rec.streaming {
			rec.send()
		}
	case rec.streaming:
		// Already sent, in part or in whole; record that it ran.
		how := "streamed"
		if rec.hijacked {
			how = "hijacked"
		}
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelInfo, "idempotent response passed through; storing it without its body",
			slog.String("key", ex.lease.Key), slog.Int("status", status), slog.String("how", how))
		ex.complete(&Response{Status: status, Header: ex.keptHeader(), BodyOmitted: true})
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
		// Stored, or not even after retrying: either way the effect
		// happened once, and the client is told what it was.
		rec.send()
	}
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

// retryStore calls op until it succeeds, fails for good, or the store timeout
// ends. ErrLeaseLost and ErrNotCommitted are final: trying again cannot
// change them.
func (ex *exchange) retryStore(op func(context.Context) error) error {
	ctx := ex.storeContext(ex.m.cfg.storeTimeout)
	defer ctx.stop()
	var timer *time.Timer
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		err := op(ctx)
		if err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotCommitted) {
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
	err := ex.retryStore(func(ctx context.Context) error {
		return m.store.Complete(ctx, ex.lease.ID, ex.lease.Token, resp, m.cfg.ttl)
	})
	switch {
	case err == nil:
	case errors.Is(err, ErrNotCommitted):
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotent request not committed; answering 503",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	default:
		// The response goes to the client anyway, and the key stays
		// claimed: retries get 409 until the lease ends, and run the
		// request again after that.
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelError, "idempotent response not stored; the key stays in flight until its lease ends, and a retry after that runs the request again",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.Any("error", err))
	}
	return err
}

func (ex *exchange) release(why string) {
	m := ex.m
	err := ex.retryStore(func(ctx context.Context) error {
		return m.store.Release(ctx, ex.lease.ID, ex.lease.Token)
	})
	if err != nil {
		m.cfg.logger.LogAttrs(ex.r.Context(), slog.LevelWarn, "idempotency claim not released; retries get 409 until its lease expires",
			slog.String("key", ex.lease.Key), slog.String("scope", ex.lease.Scope), slog.String("reason", why), slog.Any("error", err))
	}
}

// keptHeader returns the response headers on the replay list, copied so that
// the stored values never share memory with the live response.
func (ex *exchange) keptHeader() http.Header {
	h := ex.w.Header()
	var names [16]string
	kept, n := names[:0], 0
	for name, vs := range h {
		if len(vs) > 0 && ex.m.replays(name) {
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

// replays reports whether the response header name is on the replay list.
// A handler that writes the header map directly may use a name that is not
// canonical.
func (m *Middleware) replays(name string) bool {
	if _, ok := m.replayable[name]; ok {
		return true
	}
	_, ok := m.replayable[http.CanonicalHeaderKey(name)]
	return ok
}

// replay answers with a stored response. The headers are copied: whatever a
// writer in front of the middleware does to them must not reach the record.
func (ex *exchange) replay(resp *Response) {
	h := ex.w.Header()
	n := 1
	if resp.BodyOmitted {
		n++
	}
	for _, vs := range resp.Header {
		n += len(vs)
	}
	values := make([]string, 0, n)
	for name, vs := range resp.Header {
		start := len(values)
		values = append(values, vs...)
		h[name] = values[start:len(values):len(values)]
	}
	values = append(values, "true")
	h[ex.m.cfg.replayHeader] = values[len(values)-1 : len(values) : len(values)]
	if resp.BodyOmitted {
		values = append(values, "true")
		h[HeaderBodyOmitted] = values[len(values)-1 : len(values) : len(values)]
	}
	if needsLength(resp.Status, len(resp.Body)) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	ex.w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		ex.w.Write(resp.Body)
	}
}
