package server

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

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
// The engine's settings (TTL, lease, store timeout, wait, Retry-After,
// abandoned policy, fail-open, logger, observer) are one option,
// [WithConfig], as in every door; the others are the middleware's own.
// Every size option is safe at its extremes: 0 means "none" (no body
// accepted, no body stored), and the largest values mean "unbounded".
type Option func(*config)

type config struct {
	engine         engine.Config
	methods        []string
	optional       bool
	header         string
	replayHeader   string
	scope          func(*http.Request) (string, error)
	fingerprint    func(r *http.Request, body []byte) (string, error)
	maxBody        int64
	maxStored      int
	keep           func(int) bool
	errorWriter    ErrorWriter
	replayHeaders  []string
	echoKey        bool
	keyFormat      func(key string) error
	scopeSet       bool // WithScope was given
	invalidOptions []error
}

func defaultConfig() config {
	return config{
		methods:       []string{http.MethodPost, http.MethodPatch},
		header:        HeaderKey,
		replayHeader:  HeaderReplayed,
		scope:         CredentialScope,
		fingerprint:   Fingerprint,
		maxBody:       DefaultMaxBody,
		maxStored:     DefaultMaxStored,
		keep:          DefaultKeep,
		errorWriter:   WriteProblem,
		replayHeaders: defaultReplayHeaders,
		echoKey:       true,
	}
}

func (c *config) invalid(format string, args ...any) {
	c.invalidOptions = append(c.invalidOptions, fmt.Errorf("server: "+format, args...))
}

// WithConfig sets the engine's configuration, the same for every door:
// how long a record is kept (TTL), the lease the handler runs under and
// how it is renewed, the bound of every store call, how long a request
// whose key is in flight waits, the Retry-After of a 409 or 503, what a
// takeover of an abandoned key gets, whether a failing store lets the
// handler run unprotected, the logger and the observer. Each field's
// documentation is [engine.Config]'s; a zero field is the engine's default,
// and [New] refuses a configuration that [engine.New] refuses, with its
// message. A later WithConfig replaces an earlier one whole.
//
// In this door: the handler's context carries its lease
// ([engine.LeaseFromContext]) and is cancelled when the lease is lost;
// Retry-After is sent in whole seconds, at least one, and a 409's is never
// longer than what is left of the lease of the request in flight; the
// observer's [engine.Event] has the HTTP status the client was sent;
// Config.FailOpen runs the handler unprotected when the store fails, so a
// retry may run it twice. Under [engine.RefuseAbandoned] the refusal is a
// final 409 Conflict without Retry-After: the request conflicts with the
// state of the key's record, which only an operator can settle, as the
// Idempotency-Key draft and the payment APIs that use keys answer a key
// that cannot be processed as asked. The client of this module retries a
// 409 only when it is the in-flight problem or carries Retry-After, so it
// treats this one as final; its problem type is
// https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrOutcomeUnknown
// and its code "outcome_unknown".
//
// The logger gets store failures, lost leases, responses that could not be
// stored, and a callback's panic, each message at most once a second; keys
// are logged, credentials and bodies never are. A panic in the logger's
// handler is recovered, and the record dropped: the middleware logs while
// a key is held.
//
// Store calls run on a context that the client's disconnect does not
// cancel (a dropped connection is exactly when the retry will come), so a
// Store must return when its context's deadline passes: the bounds depend
// on it.
func WithConfig(cfg engine.Config) Option {
	return func(c *config) { c.engine = cfg }
}

// WithKeep sets which handler statuses are kept: stored and replayed to
// every retry. For the others the claim is released, so that a retry runs
// the handler again. The default is [DefaultKeep]; to keep 5xx responses
// as well, as some payment APIs do, pass a function that returns true
// except for 408 and 429. It is called after the handler ran, while the
// key is held: a panic in it is recovered and logged once, and DefaultKeep
// decides for that response.
func WithKeep(fn func(status int) bool) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithKeep needs a function")
			return
		}
		c.keep = fn
	}
}

// DefaultKeep keeps every status except 5xx, 408 and 429: those say that a
// retry may succeed, so the retry must run the handler again.
func DefaultKeep(status int) bool {
	return status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
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

// WithScope sets the function that names the caller a key belongs to, so that
// two callers never share a record.
//
// The default, [CredentialScope], is a hash of the request's credential
// headers: Authorization, Proxy-Authorization and the API-key headers listed
// in [CredentialScope] (X-Api-Key, Api-Key, X-Auth-Token, ...), never the
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

// WithEchoKey sets whether every answer to a request with a valid key, the
// original, a replay or a refusal, carries the key back in the key header, as
// the client sent it. It does by default, so that a client can tell which
// operation an answer belongs to without reading its body (stripe-go reads
// it into LastResponse.IdempotencyKey).
func WithEchoKey(on bool) Option {
	return func(c *config) { c.echoKey = on }
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
