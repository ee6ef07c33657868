package server

import (
	"errors"
	"io"
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
	late       lateWork            // responses stored after they were sent
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
	var start time.Time
	if m.cfg.observer != nil {
		start = time.Now()
	}
	values := r.Header[m.cfg.header]
	if len(values) == 0 {
		if m.cfg.optional {
			next.ServeHTTP(w, r)
			m.observe(r, Event{Kind: EventUnprotected, Start: start})
			return
		}
		m.reject(w, r, start, ID{}, problem(ErrMissingKey, "This request requires the "+m.cfg.header+" header.", nil))
		return
	}
	if len(values) > 1 {
		m.reject(w, r, start, ID{}, problem(ErrInvalidKey, "The "+m.cfg.header+" header appears more than once.", nil))
		return
	}
	key, err := keyfield.Parse(values[0])
	if err != nil {
		m.reject(w, r, start, ID{}, problem(ErrInvalidKey, "The "+m.cfg.header+" header is invalid: "+err.Error()+".", nil))
		return
	}
	ex := &exchange{m: m, w: w, r: r, next: next, timing: timing{start: start}}
	if m.cfg.echoKey {
		// A slice of its own, in the exchange: nothing done to the
		// response's headers may reach the request's.
		ex.echo[0] = values[0]
		w.Header()[m.cfg.header] = ex.echo[:1:1]
	}
	body, err := m.readBody(r)
	if err != nil {
		m.reject(w, r, start, ID{Key: key}, m.bodyFailed(err))
		return
	}
	scope, err := m.cfg.scope(r)
	if err != nil {
		m.reject(w, r, start, ID{Key: key}, problem(ErrUnidentified, "The caller of this request could not be identified.", err))
		return
	}
	fp, err := m.cfg.fingerprint(r, body)
	if err != nil {
		m.reject(w, r, start, ID{Scope: scope, Key: key}, problem(ErrUnidentified, "This request could not be fingerprinted.", err))
		return
	}
	ex.body, ex.fingerprint = body, fp
	ex.lease.ID = ID{Scope: scope, Key: key}
	ex.handle()
}

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, e *Error) {
	m.cfg.errorWriter(w, r, e)
}

// reject refuses a request before any claim, and says so to the observer.
func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, start time.Time, id ID, e *Error) {
	m.refuse(w, r, e)
	m.observe(r, Event{Kind: EventRejected, Scope: id.Scope, Key: id.Key, Status: e.Status, Start: start, Err: e.cause})
}

// observe gives e to the observer, if there is one.
func (m *Middleware) observe(r *http.Request, e Event) {
	if m.cfg.observer != nil {
		m.cfg.observer(r.Context(), e)
	}
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
