package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/keyfield"
	"github.com/idemkit/idempotency/internal/wire"
)

// Middleware honours the Idempotency-Key header in front of an http.Handler.
// Create one with [New] and wrap handlers with [Middleware.Handler]. Its
// configuration is immutable, and it is safe for concurrent use.
type Middleware struct {
	engine     *engine.Engine
	binder     bool // the store is a Binder
	observed   bool // an observer is set: requests are timed for it
	cfg        config
	replayable map[string]struct{} // cfg.replayHeaders
	// fingerprintInPlace: cfg.fingerprint is Fingerprint, whose value
	// serve computes into the stored response's allocation.
	fingerprintInPlace bool

	// What is logged once per Middleware.
	keepPanicked        atomic.Bool
	errorWriterPanicked atomic.Bool
	noCredentials       atomic.Bool
	bearerScope         atomic.Bool
}

// New returns middleware that protects requests with store. The options are
// checked: an invalid one is an error that names every invalid option. A nil
// store, or a nil pointer in a Store interface (var s memstore.Store), is
// refused.
func New(store engine.Store, opts ...Option) (*Middleware, error) {
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			cfg.invalid("option %d is nil", i)
			continue
		}
		o(&cfg)
	}
	e, err := engine.New(store, cfg.engine)
	if err != nil {
		cfg.invalidOptions = append(cfg.invalidOptions, fmt.Errorf("server: %w", err))
	}
	if err := errors.Join(cfg.invalidOptions...); err != nil {
		return nil, err
	}
	m := &Middleware{engine: e, cfg: cfg, replayable: make(map[string]struct{}, len(cfg.replayHeaders)), fingerprintInPlace: isFingerprint(cfg.fingerprint)}
	for _, name := range cfg.replayHeaders {
		// net/http keeps headers under their canonical names: "Etag",
		// not "ETag".
		m.replayable[http.CanonicalHeaderKey(name)] = struct{}{}
	}
	_, m.binder = store.(engine.Binder)
	m.observed = cfg.engine.Observer != nil
	return m, nil
}

// Handler wraps next. Its shape, func(http.Handler) http.Handler, is the one
// routers such as chi take for middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// protects reports whether requests with method are protected. Methods are
// case-sensitive, yet a client may send "post" with a key (net/http's
// client sends the method as given) to a handler that does not look at the
// method: left unprotected, each of its retries would run again.
func (m *Middleware) protects(method string) bool {
	for _, p := range m.cfg.methods {
		if p == method || strings.EqualFold(p, method) {
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
	var start time.Time
	if m.observed {
		start = time.Now()
	}
	values := r.Header[m.cfg.header]
	if len(values) == 0 {
		if m.cfg.optional {
			next.ServeHTTP(w, r)
			m.observe(r, engine.Event{Kind: engine.EventUnprotected, Start: start})
			return
		}
		m.reject(w, r, start, engine.ID{}, problem(ErrMissingKey, "This request requires the "+m.cfg.header+" header.", nil))
		return
	}
	if len(values) > 1 {
		m.reject(w, r, start, engine.ID{}, problem(ErrInvalidKey, "The "+m.cfg.header+" header appears more than once.", nil))
		return
	}
	key, err := keyfield.Parse(values[0])
	if err != nil {
		e := problem(ErrInvalidKey, "The "+m.cfg.header+" header is invalid: "+err.Error()+".", nil)
		if errors.Is(err, keyfield.ErrTooLong) {
			e.Code = wire.CodeKeyTooLong
		}
		m.reject(w, r, start, engine.ID{}, e)
		return
	}
	if m.cfg.keyFormat != nil {
		if err := m.cfg.keyFormat(key); err != nil {
			m.reject(w, r, start, engine.ID{}, problem(ErrInvalidKey, "The "+m.cfg.header+" header is invalid: "+err.Error()+".", err))
			return
		}
	}
	ex := &exchange{m: m, w: w, r: r, next: next}
	ex.call.Start = start
	if m.cfg.echoKey {
		// A slice of its own, in the exchange: nothing done to the
		// response's headers may reach the request's.
		ex.echo[0] = values[0]
		w.Header()[m.cfg.header] = ex.echo[:1:1]
	}
	body, err := m.readBody(r, ex.inline[:0])
	if err != nil {
		m.reject(w, r, start, engine.ID{Key: key}, m.bodyFailed(err))
		return
	}
	scope, err := m.cfg.scope(r)
	if err != nil {
		m.reject(w, r, start, engine.ID{Key: key}, problem(ErrUnidentified, "The caller of this request could not be identified.", err))
		return
	}
	if len(scope) > engine.MaxScopeLen {
		m.reject(w, r, start, engine.ID{Key: key}, problem(ErrUnidentified, "The caller of this request could not be identified.",
			fmt.Errorf("server: the scope function returned %d bytes, more than %d", len(scope), engine.MaxScopeLen)))
		return
	}
	if scope == "" && !m.cfg.scopeSet && !m.noCredentials.Load() && !m.noCredentials.Swap(true) {
		m.engine.Logger().LogAttrs(r.Context(), slog.LevelWarn,
			"idempotent request without credentials: every such caller shares one scope, and can be replayed another's response; set WithScope to the authenticated principal",
			slog.Any("headers", credentialHeaders[:]), slog.String("method", r.Method), slog.String("path", r.URL.Path))
	}
	if scope != "" && !m.cfg.scopeSet && !m.bearerScope.Load() {
		if name := bearerHeader(r.Header); name != "" && !m.bearerScope.Swap(true) {
			m.engine.Logger().LogAttrs(r.Context(), slog.LevelWarn,
				"idempotent request scoped by a bearer token: a retry whose token was refreshed falls in another scope, and runs again; set WithScope to the authenticated principal",
				slog.String("header", name), slog.String("method", r.Method), slog.String("path", r.URL.Path))
		}
	}
	var fp string
	if m.fingerprintInPlace {
		// In the allocation that a first execution's stored response
		// takes too: one allocation fewer than a string of its own.
		ex.kept = new(keptResponse)
		fingerprint(&ex.kept.fp, r, body)
		fp = ex.kept.fingerprintString()
	} else {
		fp, err = m.cfg.fingerprint(r, body)
	}
	if err != nil {
		m.reject(w, r, start, engine.ID{Scope: scope, Key: key}, problem(ErrUnidentified, "This request could not be fingerprinted.", err))
		return
	}
	ex.body = body
	ex.id = engine.ID{Scope: scope, Key: key}
	m.engine.Do(r.Context(), &ex.call, ex.id, fp, ex)
}

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, e *Error) {
	m.cfg.errorWriter(w, r, e)
}

// reject refuses a request before any claim, and says so to the observer.
func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, start time.Time, id engine.ID, e *Error) {
	m.refuse(w, r, e)
	m.observe(r, engine.Event{Kind: engine.EventRejected, Scope: id.Scope, Key: id.Key, Status: e.Status, Start: start, Err: e.cause})
}

// observe gives e to the observer, if there is one.
func (m *Middleware) observe(r *http.Request, e engine.Event) {
	m.engine.Observe(r.Context(), e)
}

// keeps reports whether a response with status is kept, by the function of
// WithKeep. It is called while the key is held: a panic in it would leave
// the key claimed until its lease ended, for a request that ran, so it is
// recovered and logged once, and DefaultKeep decides.
func (m *Middleware) keeps(ctx context.Context, status int) (keep bool) {
	defer func() {
		if v := recover(); v != nil {
			if !m.keepPanicked.Swap(true) {
				m.engine.Logger().LogAttrs(ctx, slog.LevelError, "idempotency keep function panicked; DefaultKeep decides instead, and its panics are not logged again",
					slog.Int("status", status), slog.String("panic", fmt.Sprint(v)))
			}
			keep = DefaultKeep(status)
		}
	}()
	return m.cfg.keep(status)
}

// refuseHeld writes the refusal e into rec while the key is held, so that it
// can be stored: a panic in the ErrorWriter there would leave the key
// claimed, so it is recovered and logged once, and WriteProblem writes the
// refusal instead, over whatever the ErrorWriter had written.
func (m *Middleware) refuseHeld(rec *recorder, r *http.Request, e *Error) {
	defer func() {
		if v := recover(); v != nil {
			if !m.errorWriterPanicked.Swap(true) {
				m.engine.Logger().LogAttrs(r.Context(), slog.LevelError, "idempotency error writer panicked; WriteProblem answers instead, and its panics are not logged again",
					slog.Int("status", e.Status), slog.String("panic", fmt.Sprint(v)))
			}
			rec.status, rec.body = 0, nil
			WriteProblem(rec, r, e)
		}
	}()
	m.cfg.errorWriter(rec, r, e)
}

// bodyFailed is the refusal of a request whose body could not be read.
// Nothing has been claimed, so nothing is left behind. It is answered even
// when the request's context is done: net/http cancels it when the
// connection ends mid-body, yet a client that only closed its sending side
// still reads the answer, and silence would reach it as an empty 200.
func (m *Middleware) bodyFailed(err error) *Error {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		return problem(ErrBodyTooLarge, "The request body is larger than "+strconv.FormatInt(m.cfg.maxBody, 10)+" bytes.", nil)
	case errors.As(err, &tooLarge):
		// A limit set in front of the middleware (http.MaxBytesReader).
		return problem(ErrBodyTooLarge, "The request body is larger than "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes.", err)
	default:
		return problem(ErrBodyUnreadable, "The request body could not be read to its end.", err)
	}
}

// bodyChunk is the most that readBody allocates ahead of the bytes that
// arrive: a declared Content-Length is a promise, not a reason to reserve
// memory.
const bodyChunk = 32 << 10

// readBody reads the whole request body, up to the limit, into buf when it
// fits (a body whose length is declared, or unknown, and small). Its buffer
// grows as bytes arrive, so that a client that declares a large body and
// sends little holds little memory.
func (m *Middleware) readBody(r *http.Request, buf []byte) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	limit := m.cfg.maxBody
	if r.ContentLength > limit {
		return nil, ErrBodyTooLarge
	}
	// One byte past the limit is read to tell a body at the limit from a
	// longer one; at the largest limit there is no such byte, and a slice
	// cannot be that long anyway.
	reach := limit
	if limit < math.MaxInt64 {
		reach = limit + 1
	}
	size := int64(bodyChunk)
	if r.ContentLength >= 0 && r.ContentLength < bodyChunk {
		// The whole body, and one byte more to see its end without a
		// second allocation.
		size = r.ContentLength + 1
	}
	if r.ContentLength >= 0 && size > int64(cap(buf)) {
		buf = make([]byte, 0, min(size, reach))
	}
	for {
		if len(buf) == cap(buf) {
			if cap(buf) < bodyChunk {
				// Out of the small buffer, for a body of unknown
				// length: a chunk, as if there had been none.
				buf = append(make([]byte, 0, min(bodyChunk, reach)), buf...)
			} else {
				buf = append(buf, 0)[:len(buf)]
			}
		}
		n, err := r.Body.Read(buf[len(buf):min(int64(cap(buf)), reach)])
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
