package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// Defaults of a Client; each has an Option to change it.
const (
	defaultMaxAttempts    = 4
	defaultBaseDelay      = 250 * time.Millisecond
	defaultMaxDelay       = 8 * time.Second
	defaultMaxRetryAfter  = 30 * time.Second
	defaultAttemptTimeout = 30 * time.Second
	defaultMaxBuffered    = 1 << 20
)

// An Option configures a Client; see [NewClient].
type Option func(*config)

// config is a Client's configuration. It is not changed after newConfig
// returns, so it is shared by concurrent calls without locking; its key
// source, which changes, locks itself.
type config struct {
	httpClient *http.Client

	choose func(*http.Request) Dialect // nil: the zero Dialect for all
	secret []byte                      // of derived keys; nil: none
	keyed  []string

	policy         Policy
	maxAttempts    int
	baseDelay      time.Duration
	maxDelay       time.Duration
	maxRetryAfter  time.Duration
	attemptTimeout time.Duration
	budget         *Budget
	budgetSet      bool
	maxBuffered    int64

	logger   *slog.Logger
	observer Observer
	rand     func(n int64) int64 // returns a number in [0, n)
	invalid  []error             // the options that were refused

	// Built by newConfig.
	doClient  *http.Client // for Do: follows redirects
	rtClient  *http.Client // for Transport: leaves redirects to its caller
	transport *roundTripper
	keys      keySource
	calls     atomic.Uint64 // numbers the calls, for the observer

	panicLogged atomic.Bool // a function of the caller's panicked, and it was logged
	doubtLogged atomic.Bool // a server that may not honour keys was logged
}

// refuse records an invalid option, for NewClient to report.
func (c *config) refuse(format string, args ...any) {
	c.invalid = append(c.invalid, fmt.Errorf("idempotency: "+format, args...))
}

func newConfig(opts []Option) (*config, error) {
	cfg := &config{
		keyed:          []string{http.MethodPost, http.MethodPatch},
		policy:         DefaultPolicy,
		maxAttempts:    defaultMaxAttempts,
		baseDelay:      defaultBaseDelay,
		maxDelay:       defaultMaxDelay,
		maxRetryAfter:  defaultMaxRetryAfter,
		attemptTimeout: defaultAttemptTimeout,
		maxBuffered:    defaultMaxBuffered,
		rand:           rand.Int64N,
	}
	for i, opt := range opts {
		if opt == nil {
			cfg.refuse("option %d is nil", i)
			continue
		}
		opt(cfg)
	}
	if err := errors.Join(cfg.invalid...); err != nil {
		return nil, err
	}
	if !cfg.budgetSet {
		cfg.budget = NewBudget(defaultBudgetCapacity)
	}

	hc := cfg.httpClient
	if hc == nil {
		hc = &http.Client{}
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	// attemptTransport has no CloseIdleConnections method, so that no
	// call of it on the internal http.Clients can reach base, which may be
	// shared with the rest of the program.
	at := &attemptTransport{
		base:     base,
		cause:    &attemptTimeoutError{d: cfg.attemptTimeout},
		timeouts: attemptTimeouts{d: cfg.attemptTimeout},
	}
	cfg.doClient = &http.Client{
		Transport:     at,
		CheckRedirect: checkRedirect(hc.CheckRedirect),
		Jar:           hc.Jar,
		Timeout:       hc.Timeout,
	}
	cfg.rtClient = &http.Client{
		Transport:     at,
		CheckRedirect: useLastResponse,
		Timeout:       hc.Timeout,
	}
	cfg.transport = &roundTripper{cfg: cfg}
	return cfg, nil
}

// WithHTTPClient makes the Client send its attempts with hc's Transport,
// CheckRedirect, Jar and Timeout (nil fields mean net/http's defaults, as in
// an http.Client). They are read once, by NewClient. hc's Timeout bounds each
// attempt, including the reading of its response body, not the whole
// sequence of attempts: use the request's context for that. Errors of its
// CheckRedirect are wrapped so that they match ErrRedirect (and are not
// retried); http.ErrUseLastResponse keeps its meaning.
//
// The Transport is shared, not owned: the Client never closes its idle
// connections.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *config) {
		if hc == nil {
			c.refuse("WithHTTPClient needs an *http.Client")
			return
		}
		c.httpClient = hc
	}
}

// WithMethods sets the methods whose requests get a key: POST and PATCH
// by default. Methods are upper-cased, as the server's WithMethods does, so
// "post" is POST. An empty list, or an empty name, is an error, as it is
// for the server: a Client that keys nothing never retries a POST, which
// WithMaxAttempts(1) says more plainly.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		if len(methods) == 0 {
			c.refuse("WithMethods needs at least one method")
			return
		}
		for _, m := range methods {
			if m == "" {
				c.refuse("WithMethods needs method names, not an empty one")
				return
			}
		}
		c.keyed = make([]string, len(methods))
		for i, m := range methods {
			c.keyed[i] = strings.ToUpper(m)
		}
	}
}

// WithRetryPolicy replaces DefaultPolicy, which decides which results are
// retried.
func WithRetryPolicy(p Policy) Option {
	return func(c *config) {
		if p == nil {
			c.refuse("WithRetryPolicy needs a Policy")
			return
		}
		c.policy = p
	}
}

// WithMaxAttempts sets the largest number of attempts per request,
// including the first: 4 by default. 1 turns retrying off; below 1 is an
// error.
func WithMaxAttempts(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.refuse("max attempts %d is below 1", n)
			return
		}
		c.maxAttempts = n
	}
}

// WithBackoff sets the exponential backoff: before retry n (from 0) Do waits
// a random duration between 0 and min(limit, base·2ⁿ), 250ms and 8s by
// default. A base of 0 means no wait. A negative base, or a limit below the
// base, is an error.
func WithBackoff(base, limit time.Duration) Option {
	return func(c *config) {
		if base < 0 || limit < base {
			c.refuse("backoff from %v to %v is not a range from 0 or more", base, limit)
			return
		}
		c.baseDelay, c.maxDelay = base, limit
	}
}

// WithMaxRetryAfter sets the longest wait that a Retry-After response header
// can ask for: 30s by default. A longer request is cut to d. A d of 0 makes
// the Client ignore Retry-After and use its backoff; a negative d is an
// error.
func WithMaxRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.refuse("max Retry-After %v is negative", d)
			return
		}
		c.maxRetryAfter = d
	}
}

// WithAttemptTimeout bounds how long one attempt waits for its response
// headers: 30s by default. An attempt that runs out of time fails with an
// error matching ErrAttemptTimeout and is retried. The timer stops when the
// headers arrive, so a long response body is not cut. A d of 0 turns the
// attempt timeout off; a negative d is an error. It is distinct from the
// deadline of the request's context, which bounds all attempts and the waits
// between them.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.refuse("attempt timeout %v is negative", d)
			return
		}
		c.attemptTimeout = d
	}
}

// WithBudget makes the Client draw its retries from b, which may be shared
// with other clients so that they limit their retries together; a nil b
// turns the budget off, so that retries are limited only by the number of
// attempts and the request's context. Without it, every Client has a
// Budget of its own (see [Budget]).
func WithBudget(b *Budget) Option {
	return func(c *config) { c.budget, c.budgetSet = b, true }
}

// WithMaxBufferedBody sets how many bytes of a request body without GetBody
// the Client keeps in memory to send again on a retry: 1 MiB by default. A
// larger body is streamed to the first attempt and never retried (see
// ErrBodyNotReplayable). A request with GetBody (as http.NewRequest sets for
// bytes.Buffer, bytes.Reader and strings.Reader bodies) is not buffered at
// all. 0 keeps nothing; a negative n is an error. The buffer grows as the
// body is read, so neither a large n nor a large ContentLength allocates
// memory in advance.
func WithMaxBufferedBody(n int64) Option {
	return func(c *config) {
		if n < 0 {
			c.refuse("body buffer limit %d is negative", n)
			return
		}
		c.maxBuffered = n
	}
}

// WithLogger makes the Client log each retry at level Info, and each result
// that was retryable but was not retried at level Warn, with the key, the
// method, the URL without its query, the attempt, the wait and the status or
// error. Request headers and bodies are never logged. Without it the Client
// logs nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.refuse("WithLogger needs a logger")
			return
		}
		c.logger = l
	}
}

// WithObserver makes the Client give fn an Event for every attempt: what it
// got, and what the Client did next (retried, after which wait; or how the
// call ended, and why it stopped retrying), with the attempt's timing and
// the tokens left in the retry budget: the raw material of metrics and
// traces. fn is called on the goroutine that called Do, so it should return
// quickly. Without an observer the Client does none of that work, and
// allocates nothing for it.
func WithObserver(fn Observer) Option {
	return func(c *config) {
		if fn == nil {
			c.refuse("WithObserver needs a function")
			return
		}
		c.observer = fn
	}
}
