package idempotency

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency/internal/hint"
	"github.com/idemkit/idempotency/internal/keyfield"
)

// A Dialect is how one API takes idempotency keys: the header that carries
// them, the form a key must have there, and what its responses say about a
// key. The zero Dialect is this module's own, which package server speaks:
// the key in Idempotency-Key, bare (not quoted), up to 255 printable ASCII
// characters; a replay marked Idempotent-Replayed: true (as Stripe marks
// it); the final answers and the in-flight 409 read from package server's
// problem documents (ErrKeyMismatch, ErrOutcomeUnknown, DefaultPolicy). A
// Dialect with a key header of its own and no Answer reads, besides, the
// replay markers of the APIs that use other headers:
// X-Idempotency-Status: replayed, Request-Idempotency: true and
// X-Idempotency-Replayed: true.
//
// A Client speaks the zero Dialect to every server unless WithDialect
// chooses another for a request, such as those of package vendors, which
// follow the published rules of Stripe, Adyen, PayPal, Checkout.com,
// Worldline, Azure (OASIS Repeatable Requests), Telnyx and Resend. A field
// left zero keeps the zero Dialect's behaviour for it.
type Dialect struct {
	// Header is the request header that carries the key: Idempotency-Key
	// when empty. Repeatability-Request-ID (in any letter case) speaks
	// OASIS Repeatable Requests: the Client sends with it
	// Repeatability-First-Sent, the time of the operation's first attempt
	// (an HTTP-date, in UTC), the same on every retry; a key carried by
	// ContextWithKey carries that time too, when given. A
	// Repeatability-First-Sent that the caller put in the request's header
	// (one value, in any letter case) is sent instead, as it is, whoever
	// made the key. A request for
	// which the Client would make a key, but whose header holds one under
	// Idempotency-Key while Header is another name, is refused
	// (ErrInvalidKey) rather than sent with two different keys.
	Header string

	// Key, if set, checks a key against the API's rules (its length, its
	// characters) and returns it in the form in which it is sent: the key
	// itself, or a rewriting of it, such as strconv.Quote for an API that
	// wants the IETF draft's quoted form, or a prefix. It must give the
	// same form for the same key, in every process and release, since a
	// key stored with an operation, or derived in a handler, must be sent
	// alike on every try. It is given every key that the Client sends: one
	// it made (a random UUID), one derived from an incoming key, one from
	// ContextWithKey; a key the caller put in the header is only checked
	// with it, and sent as it is. An error refuses the request before any
	// attempt (ErrInvalidKey). The zero Dialect's keys, up to 255
	// printable ASCII characters, are checked before Key sees them.
	Key func(key string) (string, error)

	// Answer, if set, reads what a response says about its key, in place
	// of the zero Dialect's reading. body is the start of the response
	// body, up to 4 KiB (decompressed, if the response's Content-Encoding
	// is gzip), for a status of 400 or more (nil otherwise): what arrives
	// within 250 ms (or the attempt timeout, if shorter). The body stays
	// whole, as it came, for the caller, however long it takes. Answer
	// returns:
	//
	//   - kind: EventReplayed for a response that the API marks as the
	//     replay of an earlier attempt (Outcome.Replayed), which is not
	//     retried, whatever its status, since another attempt with the key
	//     would get it again;
	//     EventCompleted for one that shows that the API took the key,
	//     without telling whether it ran the request or replayed it
	//     (Outcome.Honoured); EventRetried for the API's answer that a
	//     request with the key is still in progress, which the Client
	//     retries (within its limits), after wait if wait is not 0 and
	//     the response has no Retry-After; or 0 when the response says
	//     nothing of the key.
	//   - final: the API's final answer, never retried, and never a
	//     replay (it overrules kind EventReplayed): ErrKeyMismatch
	//     when it refuses the key because it came with another request
	//     (changed payload), ErrOutcomeUnknown when it will not run the
	//     request again and cannot say whether it ran; or nil.
	//
	// Answer must not read or close resp.Body. One that panics is taken as
	// saying nothing.
	Answer func(resp *http.Response, body []byte) (kind EventKind, wait time.Duration, final error)
}

// Headers of OASIS Repeatable Requests Version 1.0, canonical.
const (
	oasisRequestID = "Repeatability-Request-Id"
	oasisFirstSent = "Repeatability-First-Sent"
)

// Bounds of a key in the form a Dialect's Key function gives it.
const maxWireKey = 1 << 10

// dialect is a Dialect as a call uses it.
type dialect struct {
	header string // canonical
	oasis  bool
	others bool // reads the replay markers of other APIs
	key    func(string) (string, error)
	answer func(*http.Response, []byte) (EventKind, time.Duration, error)
}

// defaultDialect is the zero Dialect's. It is never modified: calls
// share it.
var defaultDialect = &dialect{header: "Idempotency-Key"}

func (d Dialect) resolve() *dialect {
	if d.Header == "" {
		d.Header = defaultDialect.header
	}
	h := textproto.CanonicalMIMEHeaderKey(d.Header)
	return &dialect{header: h, oasis: h == oasisRequestID, others: h != defaultDialect.header, key: d.Key, answer: d.Answer}
}

// WithDialect makes the Client speak, to the destination of each request,
// the Dialect that choose returns for it, usually chosen by host:
//
//	idempotency.WithDialect(func(req *http.Request) idempotency.Dialect {
//		switch req.URL.Hostname() {
//		case "api.stripe.com":
//			return vendors.Stripe()
//		case "api-m.paypal.com":
//			return vendors.PayPal()
//		}
//		return idempotency.Dialect{} // this module's own
//	})
//
// choose is called once per call to Do, before the first attempt, with
// the caller's request, which it must not modify; a Dialect whose Header
// is not a valid header name refuses the request with ErrInvalidKey. It
// may be called concurrently. One that panics refuses the request. Without
// WithDialect every request gets the zero Dialect.
func WithDialect(choose func(req *http.Request) Dialect) Option {
	return func(c *config) {
		if choose == nil {
			c.refuse("WithDialect needs a function")
			return
		}
		c.choose = choose
	}
}

// dialectFor returns the dialect of req.
func (cfg *config) dialectFor(req *http.Request) (d *dialect, err error) {
	if cfg.choose == nil {
		return defaultDialect, nil
	}
	defer func() {
		if v := recover(); v != nil {
			cfg.panicked(req.Context(), "dialect function", v)
			err = fmt.Errorf("dialect function panicked: %v", v)
		}
	}()
	dd := cfg.choose(req)
	if !validHeaderName(dd.Header) {
		return nil, fmt.Errorf("%w: dialect header %q is not a header name", ErrInvalidKey, dd.Header)
	}
	return dd.resolve(), nil
}

// validHeaderName reports whether name is empty or an HTTP token.
func validHeaderName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0:
		default:
			return false
		}
	}
	return true
}

// strayKey returns an error if h, the header of a request for which the
// Client is about to make a key, holds one under this module's key header
// while d sends keys under another: the request would carry two different
// keys, and the API would ignore the one that the caller meant.
func (d *dialect) strayKey(h http.Header) error {
	if d.header == defaultDialect.header {
		return nil
	}
	if _, n, _ := callerKey(h, defaultDialect.header); n > 0 {
		return fmt.Errorf("%w: the request has a key in %s, but its Dialect sends keys in %s", ErrInvalidKey, defaultDialect.header, d.header)
	}
	return nil
}

// wireKey returns key as d sends it.
func (d *dialect) wireKey(ctx context.Context, cfg *config, key string) (string, error) {
	if d.key == nil {
		return key, nil
	}
	w, err := d.callKey(ctx, cfg, key)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if w == "" || len(w) > maxWireKey {
		return "", fmt.Errorf("%w: the dialect's form of the key has %d bytes", ErrInvalidKey, len(w))
	}
	for i := 0; i < len(w); i++ {
		if c := w[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("%w: %w", ErrInvalidKey, keyfield.ErrCharacter)
		}
	}
	return w, nil
}

func (d *dialect) callKey(ctx context.Context, cfg *config, key string) (w string, err error) {
	defer func() {
		if v := recover(); v != nil {
			cfg.panicked(ctx, "dialect key function", v)
			w, err = "", fmt.Errorf("dialect key function panicked: %v", v)
		}
	}()
	return d.key(key)
}

// errNoAnswer stands for a dialect's Answer that panicked.
var errNoAnswer = errors.New("no answer")

// readVendor asks the call's dialect what resp says of its key.
func (c *call) readVendor(resp *http.Response) {
	var body []byte
	if resp.StatusCode >= 400 {
		body = decoded(resp.Header, peek(resp, c.drainBound()))
	}
	kind, wait, final := c.callAnswer(resp, body)
	if final == errNoAnswer {
		return
	}
	switch kind {
	case EventReplayed:
		c.replayed, c.acked = true, true
	case EventCompleted:
		c.acked = true
	case EventRetried:
		c.acked, c.inFlight, c.inFlightWait = true, true, max(wait, 0)
	}
	// A final answer is a refusal: not the replay of an earlier attempt,
	// whatever the response's markers say.
	if errors.Is(final, ErrKeyMismatch) {
		c.final, c.acked, c.inFlight, c.replayed = hint.KeyMismatch, true, false, false
	} else if errors.Is(final, ErrOutcomeUnknown) {
		c.final, c.acked, c.inFlight, c.replayed = hint.OutcomeUnknown, true, false, false
	}
}

func (c *call) callAnswer(resp *http.Response, body []byte) (kind EventKind, wait time.Duration, final error) {
	defer func() {
		if v := recover(); v != nil {
			c.cfg.panicked(c.ctx, "dialect answer function", v)
			kind, wait, final = 0, 0, errNoAnswer
		}
	}()
	return c.d.answer(resp, body)
}

// peekBody is a response body whose start is read, for Answer, by a
// goroutine of its own, which the body owns: it ends when it has read
// maxPeek bytes or the body's end, or when the body is closed. The
// body's reader gets every byte, however long the start took: the wait
// for Answer is bounded, the body is not cut for it.
type peekBody struct {
	body io.ReadCloser

	mu   sync.Mutex
	buf  []byte // what the goroutine read, guarded by mu until done
	err  error  // its last read's error, read after done
	done chan struct{}

	rest io.Reader // after done: buf's remainder, then body
}

func (b *peekBody) fill() {
	defer close(b.done)
	var chunk [512]byte
	for {
		b.mu.Lock()
		n := maxPeek - len(b.buf)
		b.mu.Unlock()
		if n <= 0 {
			return
		}
		m, err := b.body.Read(chunk[:min(n, len(chunk))])
		b.mu.Lock()
		b.buf = append(b.buf, chunk[:m]...)
		b.mu.Unlock()
		if err != nil {
			b.err = err
			return
		}
	}
}

// start returns a copy of what has been read so far.
func (b *peekBody) start() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

func (b *peekBody) Read(p []byte) (int, error) {
	if b.rest == nil {
		<-b.done
		var tail io.Reader = b.body
		if b.err != nil {
			// The body's end, or its error: given after the bytes.
			tail = errReader{b.err}
		}
		b.rest = io.MultiReader(bytes.NewReader(b.buf), tail)
	}
	return b.rest.Read(p)
}

// Close closes the body, which ends the goroutine's read, and waits for
// the goroutine.
func (b *peekBody) Close() error {
	err := b.body.Close()
	<-b.done
	return err
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// peek returns the start of resp's body, up to maxPeek bytes, as much of
// it as arrives within bound (all of it if bound is not positive), and
// leaves the body whole for the caller.
func peek(resp *http.Response, bound time.Duration) []byte {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	b := &peekBody{body: resp.Body, done: make(chan struct{})}
	resp.Body = b
	go b.fill()
	if bound <= 0 {
		<-b.done
		return b.buf
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-b.done:
		return b.buf
	case <-t.C:
		return b.start()
	}
}

const maxPeek = 4 << 10

// decoded returns the start of a response body, raw, as Answer reads it:
// decompressed, up to maxPeek bytes, if the header h says that it is
// gzip, as it stays when the caller asked for it with Accept-Encoding
// (net/http decompresses, and drops the header, only when it asked).
func decoded(h http.Header, raw []byte) []byte {
	if len(raw) == 0 {
		return raw
	}
	switch strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding"))) {
	case "gzip", "x-gzip":
	default:
		return raw
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil
	}
	// A start cut short gives what it holds.
	out, _ := io.ReadAll(io.LimitReader(zr, maxPeek))
	return out
}
