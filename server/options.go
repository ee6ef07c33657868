package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// The headers of the protocol, as the middleware reads and writes them by
// default ([WithKeyHeader] and [WithReplayedHeader] change the first two).
const (
	// HeaderKey carries the idempotency key, on requests and, echoed, on
	// answers.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed marks a replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a replay whose original body was not stored
	// (too large, streamed or hijacked): the request ran once, and its
	// status and headers are replayed without the body.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
)

// Defaults of the middleware's own limits.
const (
	// DefaultMaxBody is the largest request body accepted ([WithMaxBody]).
	DefaultMaxBody = 1 << 20
	// DefaultMaxStored is the largest response body stored ([WithMaxStored]).
	DefaultMaxStored = 1 << 20
)

// Option configures the middleware. Options are applied in order, a later
// one overriding an earlier one of the same kind; [New] refuses an invalid
// one (a nil Option included) with an error that names every invalid option
// at once.
//
// Every size and duration option is safe at its extremes: 0 is refused
// where it means nothing (a TTL, a lease, a timeout) and means "none" where
// it can (no body accepted, no body stored, no wait); the largest values
// mean "unbounded" (a TTL or lease is taken as 100 years at most).
type Option func(*config)

type config struct {
	methods        []string
	optional       bool
	header         string
	replayHeader   string
	ttl            time.Duration
	lease          time.Duration
	scope          func(*http.Request) (string, error)
	fingerprint    func(r *http.Request, body []byte) (string, error)
	maxBody        int64
	maxStored      int
	storeStatus    func(int) bool
	wait           time.Duration
	failOpen       bool
	errorWriter    ErrorWriter
	replayHeaders  []string
	logger         *slog.Logger
	storeTimeout   time.Duration
	retryAfter     time.Duration
	echoKey        bool
	observer       engine.Observer
	keyFormat      func(key string) error
	leaseSet       bool // WithLease was given: the lease does not follow the TTL
	scopeSet       bool // WithScope was given
	abandoned      engine.AbandonedPolicy
	invalidOptions []error
}

func defaultConfig() config {
	return config{
		methods:       []string{http.MethodPost, http.MethodPatch},
		header:        HeaderKey,
		replayHeader:  HeaderReplayed,
		ttl:           engine.DefaultTTL,
		lease:         engine.DefaultLease,
		scope:         CredentialScope,
		fingerprint:   Fingerprint,
		maxBody:       DefaultMaxBody,
		maxStored:     DefaultMaxStored,
		storeStatus:   DefaultStoreStatus,
		errorWriter:   WriteProblem,
		replayHeaders: defaultReplayHeaders,
		storeTimeout:  engine.DefaultStoreTimeout,
		retryAfter:    engine.DefaultRetryAfter,
		echoKey:       true,
	}
}

func (c *config) invalid(format string, args ...any) {
	c.invalidOptions = append(c.invalidOptions, fmt.Errorf("server: "+format, args...))
}

func (c *config) validate() error {
	if !c.leaseSet && c.lease > c.ttl {
		// The default lease follows a TTL shorter than itself: a lease
		// cannot outlive its record.
		c.lease = c.ttl
	}
	if c.lease > c.ttl {
		c.invalid("lease %v is longer than TTL %v", c.lease, c.ttl)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return errors.Join(c.invalidOptions...)
}

// WithMethods sets the protected methods, POST and PATCH by default, in any
// letter case: methods are upper-cased, as the client's WithMethods does,
// and a request's method is matched whatever its case ("post" is protected
// as POST). Other methods pass through untouched. An empty list, or an
// empty name, is refused, as the client refuses them.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		if len(methods) == 0 {
			c.invalid("WithMethods needs at least one method")
			return
		}
		for _, m := range methods {
			if m == "" {
				c.invalid("WithMethods needs method names, not an empty one")
				return
			}
		}
		c.methods = make([]string, len(methods))
		for i, m := range methods {
			c.methods[i] = strings.ToUpper(m)
		}
	}
}

// WithKeyOptional lets protected requests without a key through, unprotected.
// By default a protected request without a key is refused with 400.
func WithKeyOptional() Option {
	return func(c *config) { c.optional = true }
}

// WithKeyHeader sets the name of the request header that carries the key,
// Idempotency-Key by default.
func WithKeyHeader(name string) Option {
	return func(c *config) {
		if name == "" {
			c.invalid("WithKeyHeader needs a header name")
			return
		}
		c.header = http.CanonicalHeaderKey(name)
	}
}

// WithTTL sets how long a record is kept after the last moment its handler
// may have run, [DefaultTTL] (24 hours) by default: after its response was
// stored, or, while it is in flight, after its lease's end (renewals move
// it). A retry that comes later runs again, as a new request. So a retry
// within the TTL after a holder's lease ran out, its process dead, is told
// of that holder (see [WithAbandoned]) whatever the TTL and the lease, and
// however often the lease was renewed: the record of a claim in flight
// lives as long as its lease and the TTL together. A TTL shorter than the
// default lease shortens the lease to the TTL, unless [WithLease] is given
// too, which must then be no longer than the TTL. A TTL shorter than
// [MinLease] is refused; one longer than 100 years is taken as 100 years.
func WithTTL(d time.Duration) Option {
	return func(c *config) {
		if d < engine.MinLease {
			c.invalid("TTL %v is shorter than %v", d, engine.MinLease)
			return
		}
		c.ttl = min(d, engine.MaxDuration)
	}
}

// WithLease sets the lease that the handler holds while it runs,
// [DefaultLease] (one minute) by default, or the TTL when that is shorter.
// It must be at least [MinLease] and no longer than the TTL; like the TTL, it
// is taken as 100 years when longer. The middleware renews it every third of
// its length (a tenth after a failed renewal) until the response is stored.
// When the lease's end, less a tenth of it, passes without a successful
// renewal, the handler's context is cancelled with a cause that wraps
// [ErrLeaseLost]: from then on another request with the same key may take
// the record over. If this process dies, another request may take it over
// once the lease has expired, and is told of the lost holder for the TTL
// after that ([WithTTL]). The handler never starts with less than that
// tenth left: a Claim answered later, counted from when it was sent, is
// released and answered with 503 (see [WithStoreTimeout]), so choose a lease
// well above the store's slowest answers.
func WithLease(d time.Duration) Option {
	return func(c *config) {
		if d < engine.MinLease {
			c.invalid("lease %v is shorter than %v", d, engine.MinLease)
			return
		}
		c.lease, c.leaseSet = min(d, engine.MaxDuration), true
	}
}

// WithScope sets the function that names the caller a key belongs to, so that
// two callers never share a record.
//
// The default, [CredentialScope], is a hash of the request's credential
// headers: Authorization, Proxy-Authorization and the API-key headers listed
// in [CredentialHeaders] (X-Api-Key, Api-Key, X-Auth-Token, ...), never the
// headers themselves. Cookies are not part of it: a request and its retry
// often carry different cookies. A keyed request that carries none of those
// headers falls in the one scope shared by every such caller, and the first
// of them is logged at warn level. An application that knows its principal
// (a tenant or account ID set by its authentication middleware, or the
// session behind a cookie) should name it here instead; so must one whose
// credentials change between a request and its retry (a request signature,
// an OAuth bearer token refreshed between a lost answer and the retry),
// which would put the retry in another scope, where it runs again: the
// first keyed request whose default scope comes from a bearer token
// (Authorization: Bearer) is logged at warn level.
//
// An error from the function refuses the request with 400, as does a scope
// longer than engine.MaxScopeLen (1024 bytes), which a store could not
// keep: hash a longer principal.
func WithScope(fn func(*http.Request) (string, error)) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithScope needs a function")
			return
		}
		c.scope, c.scopeSet = fn, true
	}
}

// WithFingerprint sets the function that identifies a request, so that a key
// reused for a different request is refused with 422. body is the whole
// request body. The default is [Fingerprint].
func WithFingerprint(fn func(r *http.Request, body []byte) (string, error)) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithFingerprint needs a function")
			return
		}
		c.fingerprint = fn
	}
}

// WithMaxBody sets the largest request body accepted, [DefaultMaxBody]
// (1 MiB) by default. A larger one is refused with 413 and the handler does
// not run. 0 accepts only requests without a body. The body is read whole
// before the claim, into a buffer that grows as its bytes arrive, so a
// large limit reserves nothing ahead of them.
func WithMaxBody(n int64) Option {
	return func(c *config) {
		if n < 0 {
			c.invalid("body limit %d is negative", n)
			return
		}
		c.maxBody = n
	}
}

// WithMaxStored sets the largest response body stored for replay,
// [DefaultMaxStored] (1 MiB) by default; 0 stores none. A larger response is
// still sent, and still recorded as done so that the request never runs
// twice, but its replay carries the status and headers only, marked with the
// [HeaderBodyOmitted] header.
func WithMaxStored(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.invalid("stored response limit %d is negative", n)
			return
		}
		c.maxStored = n
	}
}

// WithStoreStatus sets which handler statuses are stored for replay. For the
// others the claim is released, so that a retry runs the handler again. The
// default is [DefaultStoreStatus]; to keep 5xx responses as well, as some
// payment APIs do, pass a function that returns true except for 408 and 429.
// It is called after the handler ran, while the key is held: a panic in it is
// recovered and logged once, and DefaultStoreStatus decides for that
// response.
func WithStoreStatus(fn func(status int) bool) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithStoreStatus needs a function")
			return
		}
		c.storeStatus = fn
	}
}

// DefaultStoreStatus stores every status except 5xx, 408 and 429: those say
// that a retry may succeed, so the retry must run the handler again.
func DefaultStoreStatus(status int) bool {
	return status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// WithWait makes a request whose key is in flight wait up to d for the
// original to finish and then answer with its replay (or run, if the original
// released its claim), instead of answering 409 at once. A request still
// waiting after d gets 409. 0, the default, does not wait.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.invalid("wait %v is negative", d)
			return
		}
		c.wait = d
	}
}

// WithFailOpen runs the handler unprotected when the Store fails, instead of
// answering 503. A retry may then run the handler twice: choose it only for
// requests where availability matters more than duplicates.
func WithFailOpen() Option {
	return func(c *config) { c.failOpen = true }
}

// WithErrorWriter sets how refusals are written, [WriteProblem] by default.
// A panic in it is left to net/http, as a handler's would be, except while
// the key is held (the "outcome unknown" answer of [RefuseAbandoned], which
// is stored): there it is recovered and logged once, and WriteProblem writes
// that answer instead, so that the key is never left claimed.
func WithErrorWriter(fn ErrorWriter) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithErrorWriter needs a function")
			return
		}
		c.errorWriter = fn
	}
}

// WithLogger sets where the middleware logs store failures, lost leases,
// responses it could not store, and an observer's panic; by default it logs
// to [slog.Default] as it is when [New] is called. Each message is logged at
// most once a second: the next record of a message after some were dropped
// carries their number as "suppressed", so that an outage does not flood
// the log. Keys are logged; credentials and bodies never are. A panic in the
// logger's handler is recovered, and the record dropped: the middleware logs
// while a key is held.
//
// A nil logger is refused, so that a logger that was never set cannot
// silence store failures: to log nothing, pass
// slog.New(slog.DiscardHandler).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.invalid("WithLogger needs a logger")
			return
		}
		c.logger = l
	}
}

// WithStoreTimeout bounds every Store call, [DefaultStoreTimeout]
// (5 seconds) by default: a Claim that takes longer is answered with 503 and
// the handler does not run. A Claim is also bounded by the lease less a
// tenth, and a Claim answered after that, measured from when it was sent, is
// released and answered with 503 without running the handler: the lease it
// granted is over, or nearly, and another request may already have taken the
// key over. So a lease only a little longer than the store's slowest answers
// refuses requests rather than running them twice; New accepts it. A
// Complete or Release that fails is retried until the timeout ends; an Extend
// is given at most what is left of the lease. Store calls run on a context
// that the client's disconnect does not cancel (a dropped connection is
// exactly when the retry will come), so a Store must return when its
// context's deadline passes: the bounds depend on it.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.invalid("store timeout %v is not positive", d)
			return
		}
		c.storeTimeout = d
	}
}

// WithRetryAfter sets how long a client is told to wait before it retries
// a request refused for a reason that passes, [DefaultRetryAfter] (one
// second) by default: the Retry-After of a 409 (a request with the same key
// is in flight) and of a 503 (the store failed). It is one setting, the
// retry interval of a transient refusal; a 409's is never longer than what
// is left of the lease of the request in flight, since by then the retry
// gets the answer or takes the key over. Retry-After is sent in whole
// seconds, at least one. 0 or less is refused.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.invalid("Retry-After %v is not positive", d)
			return
		}
		c.retryAfter = d
	}
}

// WithEchoKey sets whether every answer to a request with a valid key, the
// original, a replay or a refusal, carries the key back in the key header, as
// the client sent it. It does by default, so that a client can tell which
// operation an answer belongs to without reading its body (stripe-go reads
// it into LastResponse.IdempotencyKey).
func WithEchoKey(on bool) Option {
	return func(c *config) { c.echoKey = on }
}

// WithObserver sets a function that receives an [Event] for every protected
// request (what the middleware did, with the time each step took), for
// every claim that acquires its key and for every lease renewal: the raw
// material for metrics and traces. The middleware does none of that work,
// and allocates nothing for it, without an observer.
//
// A panic in the observer is recovered, and logged once per [Middleware]
// with the event's kind: the request goes on as if the observer had
// returned, so that a key is never left claimed and a lease event, which
// runs on a timer's goroutine, never takes the process down.
func WithObserver(fn engine.Observer) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithObserver needs a function")
			return
		}
		c.observer = fn
	}
}

// WithKeyFormat sets a check of the key's format, for an API that publishes
// one (a UUID, a prefix, a length): a key that fn refuses is answered 400
// with the [ErrInvalidKey] problem (code key_invalid) whose detail quotes
// fn's error, so its text must be fit for the client; the handler does not
// run and nothing is claimed. fn sees the key after the middleware's own
// checks (1 to 255 bytes of printable ASCII, unquoted if it was sent as a
// structured-field string), and must be safe for concurrent use. Like the
// scope and fingerprint functions, it runs before anything is claimed, so a
// panic in it is left to net/http, as a handler's would be.
func WithKeyFormat(fn func(key string) error) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithKeyFormat needs a function")
			return
		}
		c.keyFormat = fn
	}
}

// DefaultStoredHeaders returns the response headers stored and replayed
// unless [WithStoredHeaders] says otherwise: those that describe the stored
// body, so that a replay is the same representation (type, encoding,
// language, range, digest, validators), and those that describe the result
// (Location, Link, caching, Allow, the challenge of a 401). To store one
// more, pass append(server.DefaultStoredHeaders(), name) to
// [WithStoredHeaders]. The slice is the caller's.
func DefaultStoredHeaders() []string {
	return slices.Clone(defaultReplayHeaders)
}
