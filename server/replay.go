package server

import (
	"crypto/sha256"
	"net/http"
	"slices"
	"strconv"
	"unsafe"

	"github.com/idemkit/idempotency/engine"
)

// defaultReplayHeaders are the response headers stored and replayed by
// default; [DefaultStoredHeaders] returns them. They are the headers that describe
// the stored body, so that a replay is the same representation (type,
// encoding, language, range, digest, validators), and those that describe
// the result (Location, Link, caching, Allow, the challenge of a 401).
var defaultReplayHeaders = []string{
	"Allow", "Cache-Control", "Content-Digest", "Content-Disposition", "Content-Encoding",
	"Content-Language", "Content-Location", "Content-Range", "Content-Type", "Digest",
	"ETag", "Expires", "Last-Modified", "Link", "Location", "Repr-Digest", "Retry-After",
	"Vary", "WWW-Authenticate",
}

// neverReplayed are headers that must not be stored or replayed: credentials,
// cookies, hop-by-hop headers, and headers the replay sets itself.
var neverReplayed = []string{
	"Authorization", "Connection", "Content-Length", "Date", "Keep-Alive",
	"Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Set-Cookie", "Set-Cookie2", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	engine.HeaderOutcome,
}

// WithReplayedHeader sets the name of the response header that marks a replay,
// Idempotent-Replayed by default.
func WithReplayedHeader(name string) Option {
	return func(c *config) {
		if name == "" {
			c.invalid("WithReplayedHeader needs a header name")
			return
		}
		c.replayHeader = http.CanonicalHeaderKey(name)
	}
}

// WithStoredHeaders sets the response headers stored and replayed. Headers
// not on the list are not stored. The default list is [DefaultStoredHeaders];
// to store one more, pass append(server.DefaultStoredHeaders(), name).
// Set-Cookie, Authorization, Date, Content-Length and hop-by-hop headers are
// never stored: naming one is an error.
//
// Trailers the handler declares (in the Trailer header, with their values
// set after the body) reach the first client as trailers. A replay sends
// its stored body whole and has no trailers: a trailer whose name is on the
// list (Content-Digest, say) is stored and replayed as a header, and the
// others are not stored.
func WithStoredHeaders(names ...string) Option {
	return func(c *config) {
		c.replayHeaders = make([]string, 0, len(names))
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			if slices.Contains(neverReplayed, n) {
				c.invalid("header %s is never replayed", n)
				continue
			}
			c.replayHeaders = append(c.replayHeaders, n)
		}
	}
}

// keptValues is how many header values a stored response carries in its
// own allocation; a response with more has them allocated apart.
const keptValues = 4

// keptResponse is what a store keeps of a request, in one allocation: the
// response, its headers' values, and the request's fingerprint. They live
// and are freed together.
type keptResponse struct {
	resp   engine.Response
	values [keptValues]string
	// fp is the default fingerprint's value, which the exchange's
	// fingerprint string refers to: it is never written after it is
	// computed.
	fp [sha256.Size]byte
}

// fingerprintString returns k.fp as a string without copying it.
func (k *keptResponse) fingerprintString() string {
	return unsafe.String(&k.fp[0], len(k.fp))
}

// response returns the response to store: status, body, and the response
// headers on the replay list, copied. It uses the exchange's keptResponse,
// made with the fingerprint, once.
func (ex *exchange) response(status int, body []byte, omitted bool) *engine.Response {
	k := ex.kept
	ex.kept = nil
	if k == nil {
		k = new(keptResponse)
	}
	k.resp = engine.Response{Status: status, Body: body, BodyOmitted: omitted}
	k.resp.Header = ex.copyKept(k.values[:0])
	return &k.resp
}

// keptHeader returns the response headers on the replay list, copied so that
// the stored values never share memory with the live response.
func (ex *exchange) keptHeader() http.Header { return ex.copyKept(nil) }

// copyKept copies the response headers on the replay list, their values
// into values when they fit.
func (ex *exchange) copyKept(values []string) http.Header {
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
	if cap(values) < n {
		values = make([]string, 0, n)
	}
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
func (ex *exchange) replay(resp *engine.Response) {
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
