package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency/internal/keyfield"
)

// Client sends HTTP requests with an idempotency key and retries them when
// that is safe; see the package documentation for what it does and
// guarantees.
//
// A Client is safe for concurrent use by multiple goroutines, and should be
// made once and reused: its retry budget is shared by its requests. Its
// configuration is fixed by NewClient. The zero value is a Client with the
// defaults, sending with http.DefaultTransport; a Client must not be copied
// after first use.
type Client struct {
	once sync.Once
	cfg  *config
}

// NewClient returns a Client configured by opts. Options that are not given
// keep their defaults, documented with each option. The options are checked:
// an invalid one is an error, which names every invalid option, and no Client
// is made.
func NewClient(opts ...Option) (*Client, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg}, nil
}

func (c *Client) config() *config {
	c.once.Do(func() {
		if c.cfg == nil {
			// No options: nothing to refuse.
			c.cfg, _ = newConfig(nil)
		}
	})
	return c.cfg
}

// Do sends req, retrying it as the package documentation describes, and
// returns the last attempt's response. Like http.Client.Do, it returns a
// response with a nil error whatever its status, and the caller must close
// its body; OutcomeOf tells which key was used, how many attempts were made
// and whether the response is a replay. When no attempt produced a
// response, Do returns a *RetryError.
//
// If req's method gets a key (POST and PATCH by default) and req has none in
// its header, Do uses the key in req's context (ContextWithKey), or one
// derived from the incoming key in req's context (ContextWithStep), or else
// makes a new one, and sends it on every attempt. A key in req's header is found under
// any letter case of the header's name (as in a header map filled by hand,
// such as req.Header["idempotency-key"]), and is sent as it is, once, under
// the canonical name; a header that holds two keys (two values, under one
// spelling of the name or several) is refused with ErrInvalidKey rather
// than sent. A request is retried only if its method is idempotent (GET,
// HEAD, PUT, DELETE, OPTIONS, TRACE) or it has a key: a POST without a key
// is sent once.
//
// Do does not modify req. Like http.Client.Do, it closes req.Body, even on
// errors. It returns an error before any attempt for a nil request
// (an error), a URL that is not an absolute http or https URL with a
// host (ErrInvalidURL), an invalid key (ErrInvalidKey) and a body that
// cannot be read. A body without GetBody is read into memory (up to the
// limit of WithMaxBufferedBody) before the first attempt; if req's context
// ends while it is read, Do closes the body, so that a Read that blocks
// returns, and returns the context's error. A request whose context has
// already ended is not sent at all: Do returns a *RetryError with no
// attempt, wrapping the context's error.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	cfg := c.config()
	return cfg.do(req, cfg.doClient, false)
}

// Post sends a POST request to url with the given content type and body,
// through Do, so that it gets a key and is retried with it.
func (c *Client) Post(ctx context.Context, url, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return nil, postError(err)
	}
	req.Header.Set("Content-Type", contentType)
	return c.Do(req)
}

func postError(err error) error {
	if _, ok := errors.AsType[*url.Error](err); ok {
		return fmt.Errorf("idempotency: %w: %w", ErrInvalidURL, err)
	}
	return fmt.Errorf("idempotency: %w", err)
}

// StandardClient returns an *http.Client whose requests go through the
// Client, for code that accepts an *http.Client, such as a generated API
// client. It follows redirects with the CheckRedirect and Jar of the
// http.Client given to WithHTTPClient, if any. The Client's options,
// including that http.Client's Timeout (which bounds each attempt), apply
// to each request the returned client sends.
//
// Its Transport sends each request as Do does, with a key and retries,
// except that it does not follow redirects: as any RoundTripper, it
// returns them to the http.Client that called it, for which the request
// that follows a redirect is a new one, so it gets a new key unless the
// first request carried one in its header. The Transport is safe for
// concurrent use, and can be given to another http.Client.
func (c *Client) StandardClient() *http.Client {
	cfg := c.config()
	hc := &http.Client{Transport: cfg.transport}
	if cfg.httpClient != nil {
		hc.CheckRedirect = cfg.httpClient.CheckRedirect
		hc.Jar = cfg.httpClient.Jar
	}
	return hc
}

type roundTripper struct {
	cfg *config
}

var _ http.RoundTripper = (*roundTripper)(nil)

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	return rt.cfg.do(req, rt.cfg.rtClient, true)
}

// do is Do, with hc to send each attempt.
func (cfg *config) do(req *http.Request, hc *http.Client, viaTransport bool) (*http.Response, error) {
	if req == nil {
		return nil, errors.New("idempotency: nil request")
	}
	if err := checkURL(req.URL); err != nil {
		closeBody(req)
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	d, err := cfg.dialectFor(req)
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	k, err := cfg.keyFor(req, method, d)
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("idempotency: %w", err)
	}

	c := &call{
		ctx:          req.Context(),
		cfg:          cfg,
		d:            d,
		method:       method,
		url:          req.URL,
		key:          k.key,
		retryable:    k.key != "" || idempotent(method),
		viaTransport: viaTransport,
	}
	if cfg.observer != nil {
		c.obs = &observation{id: cfg.calls.Add(1), start: time.Now()}
	}
	c.first.init(c.ctx, c, cfg.attemptTimeout, 0)
	// The attempts' request lives in the call: one allocation less.
	c.clone = *req.WithContext(&c.first)
	clone := &c.clone
	if k.set {
		c.keyValue[0] = k.wire
		clone.Header = cloneWith(req.Header, d.header, c.keyValue[:])
	}
	if d.oasis && k.key != "" {
		if err := setFirstSent(clone, req, k); err != nil {
			closeBody(req)
			return nil, fmt.Errorf("idempotency: %w", err)
		}
	}
	if err := c.body.prepare(req, clone, cfg.maxBuffered); err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	return c.run(clone, hc)
}

// requestKey is the key of a request, as keyFor finds or makes it.
type requestKey struct {
	key    string // the operation's key; "" for none
	wire   string // as sent, in the dialect's form
	set    bool   // the Client sets the header to wire
	caller bool   // the key is in the caller's header
}

// keyFor returns the request's key and, if the Client must set it in the
// header, its value there. A key that the caller put in the header under a
// spelling of its name other than the canonical one is set again, under the
// canonical one, so that the request carries exactly one key.
func (cfg *config) keyFor(req *http.Request, method string, d *dialect) (requestKey, error) {
	value, n, respelled := callerKey(req.Header, d.header)
	if n > 1 {
		// Two keys: which one the server would honour is anyone's guess.
		return requestKey{}, fmt.Errorf("%w: %d values in %s header fields", ErrInvalidKey, n, d.header)
	}
	if n == 1 {
		key, err := keyfield.Parse(value)
		if err != nil {
			return requestKey{}, fmt.Errorf("%w: %w", ErrInvalidKey, err)
		}
		if d.key != nil {
			if _, err := d.wireKey(req.Context(), cfg, value); err != nil {
				return requestKey{}, err
			}
		}
		return requestKey{key: key, wire: value, set: respelled, caller: true}, nil
	}
	if !cfg.keyedMethod(method) {
		return requestKey{}, nil
	}
	if err := d.strayKey(req.Header); err != nil {
		return requestKey{}, err
	}
	var k requestKey
	if v, ok := keyFromContext(req.Context()); ok {
		if err := keyfield.Validate(v.key); err != nil {
			return requestKey{}, fmt.Errorf("%w: %w", ErrInvalidKey, err)
		}
		k.key = v.key
	} else if key, ok := cfg.derivedKeyFor(req, method); ok {
		k.key = key
	} else {
		// A UUID: valid by construction.
		k.key = cfg.keys.newKey()
	}
	wire, err := d.wireKey(req.Context(), cfg, k.key)
	if err != nil {
		return requestKey{}, err
	}
	k.wire, k.set = wire, true
	return k, nil
}

// setFirstSent gives clone, the request of the attempts, the header
// Repeatability-First-Sent of OASIS Repeatable Requests, fixed for all its
// attempts: the caller's, if the caller's header has one, whoever made
// the key; else the time that ContextWithKey carried with the key, or now.
// A header with two is refused, as one with two keys is.
func setFirstSent(clone, req *http.Request, k requestKey) error {
	value, n, respelled := callerKey(req.Header, oasisFirstSent)
	if n > 1 {
		return fmt.Errorf("%w: %d values in %s header fields", ErrInvalidKey, n, oasisFirstSent)
	}
	if n == 1 && !respelled {
		// Already in clone's header, under its canonical name.
		return nil
	}
	var v []string
	if n == 1 {
		v = []string{value}
	} else {
		var t time.Time
		if !k.caller {
			if ck, ok := keyFromContext(req.Context()); ok {
				t = ck.firstSent
			}
		}
		if t.IsZero() {
			t = time.Now()
		}
		v = []string{t.UTC().Format(http.TimeFormat)}
	}
	if !k.set {
		// Still the caller's header, which is never modified.
		clone.Header = cloneWith(clone.Header, oasisFirstSent, v)
		return nil
	}
	for name := range clone.Header {
		if sameName(name, oasisFirstSent) {
			delete(clone.Header, name)
		}
	}
	clone.Header[oasisFirstSent] = v
	return nil
}

// callerKey returns the first of the values that h holds under name, a
// canonical header name, in any letter case, as the header of a request
// built by hand may have it; their number; and whether some are under
// another spelling than name.
func callerKey(h http.Header, name string) (value string, n int, respelled bool) {
	if vs := h[name]; len(vs) > 0 {
		value, n = vs[0], len(vs)
	}
	for k, vs := range h {
		if len(vs) == 0 || !sameName(k, name) || k == name {
			continue
		}
		if n == 0 {
			value = vs[0]
		}
		n += len(vs)
		respelled = true
	}
	return value, n, respelled
}

// sameName reports whether the header names a and b are equal but for
// letter case.
func sameName(a, b string) bool {
	return len(a) == len(b) && strings.EqualFold(a, b)
}

func (cfg *config) keyedMethod(method string) bool {
	for _, m := range cfg.keyed {
		if m == method {
			return true
		}
	}
	return false
}

// cloneWith returns a copy of h with name, in any letter case, set to
// value under its canonical spelling only. The copy shares the values of
// h, capped so that an append to one of them copies it: neither net/http
// nor the Client changes a request's header values in place.
func cloneWith(h http.Header, name string, value []string) http.Header {
	c := make(http.Header, len(h)+1)
	c[name] = value
	for k, vs := range h {
		if sameName(k, name) {
			// Replaced by name, in any spelling.
			continue
		}
		// A nil value tells net/http not to send a header it would add.
		c[k] = vs[:len(vs):len(vs)]
	}
	return c
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// Outcome describes how a response was obtained; see [OutcomeOf].
type Outcome struct {
	// Key is the idempotency key sent on every attempt (before the form
	// that the request's Dialect may give it), or "" if the request
	// carried none: the key to give ContextWithKey for another try of the
	// same operation.
	Key string

	// Attempts is the number of attempts made, from 1. (net/http's
	// Transport may itself resend a request once, on a keep-alive
	// connection that the server closed before reading it; that is not
	// counted.)
	Attempts int

	// Replayed reports whether the server said, with a replay marker of
	// the request's Dialect (Idempotent-Replayed: true for the zero
	// Dialect), that this is the stored response of an earlier attempt
	// rather than a new execution.
	Replayed bool

	// Stopped is why no further attempt was made although this response's
	// status is one that is retried (one of ErrAttemptsExhausted,
	// ErrNotIdempotent, ErrBodyNotReplayable, ErrDeadline,
	// ErrBudgetExhausted, ErrRetryRefused); or the server's final answer
	// that the response is, which is never retried (ErrOutcomeUnknown,
	// ErrKeyMismatch); or nil.
	Stopped error

	// Kind is how the call ended, as an observer is told (see [Event]):
	// EventCompleted, EventReplayed, EventGaveUp (Stopped says why), or
	// EventCanceled when the caller's context ended before a response that
	// would have been retried.
	Kind EventKind

	// Honoured reports whether the response shows that the server honours
	// the key: it echoes the key in the key header, is a replay, or is an
	// answer about the key (an acknowledgement, an in-flight or a final
	// answer of the request's Dialect). A keyed request that was retried
	// and got a response that shows none of these may have reached a
	// server that does not honour keys, and so may have run more than
	// once: the Client logs it once, at level Warn, if it has a logger.
	Honoured bool
}

// OutcomeOf returns the Outcome of a response returned by a Client's Do or
// Post, or by an http.Client using its StandardClient or its Transport. It
// reports false for any other response.
func OutcomeOf(resp *http.Response) (Outcome, bool) {
	if resp == nil || resp.Request == nil {
		return Outcome{}, false
	}
	c, ok := resp.Request.Context().Value(callKey{}).(*call)
	if !ok {
		return Outcome{}, false
	}
	out := Outcome{
		Key:      c.key,
		Attempts: c.attempts,
		Replayed: c.replayed,
		Stopped:  c.stopped,
		Kind:     c.kind,
		Honoured: c.honoured,
	}
	if out.Kind == EventCompleted && out.Replayed {
		out.Kind = EventReplayed
	}
	return out, true
}
