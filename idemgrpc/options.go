package idemgrpc

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/engine"
)

// Option configures NewServer or UnaryClientInterceptor. WithMethods is for
// both; each other option is for one of them, as its documentation says,
// and the other refuses it. Options are applied in order, a later one
// overriding an earlier one of the same kind; an invalid one (a nil Option
// included) is refused with an error that names every invalid option.
type Option func(*options)

// options is what an Option configures: the server's configuration or the
// client's, whichever is being built.
type options struct {
	srv *serverConfig
	cli *clientConfig
}

func (o *options) refuse(format string, args ...any) {
	err := fmt.Errorf("idemgrpc: "+format, args...)
	if o.srv != nil {
		o.srv.errs = append(o.srv.errs, err)
	} else {
		o.cli.errs = append(o.cli.errs, err)
	}
}

// serverOption is an Option of NewServer, named name.
func serverOption(name string, set func(c *serverConfig)) Option {
	return func(o *options) {
		if o.srv == nil {
			o.refuse("%s is an option of NewServer, not of UnaryClientInterceptor", name)
			return
		}
		set(o.srv)
	}
}

// clientOption is an Option of UnaryClientInterceptor, named name.
func clientOption(name string, set func(c *clientConfig)) Option {
	return func(o *options) {
		if o.cli == nil {
			o.refuse("%s is an option of UnaryClientInterceptor, not of NewServer", name)
			return
		}
		set(o.cli)
	}
}

// WithMethods protects only the named methods, in the full form gRPC gives
// interceptors ("/package.Service/Method"): by default every unary method
// is protected. For the server and the client interceptor alike. A
// streaming method left out of the list is not protected, so a keyed
// streaming call of it runs, unprotected, rather than being refused.
func WithMethods(fullMethods ...string) Option {
	set := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		set[m] = true
	}
	protect := func(m string) bool { return set[m] }
	return func(o *options) {
		if o.srv != nil {
			o.srv.protect = protect
		} else {
			o.cli.protect = protect
		}
	}
}

// WithConfig sets the server's engine configuration, the same for every
// door: how long a call's record is kept (TTL), the lease a running handler
// holds and how it is renewed, the bound of every store call, how long a
// call whose key is in flight waits for the holder's answer before it is
// refused with Aborted, the delay of the RetryInfo detail and retry-after
// trailer of Aborted and Unavailable, what a takeover of an abandoned key
// gets (engine.RerunAbandoned runs it again, and the handler can see
// engine.LeaseFromContext(ctx).Abandoned; engine.RefuseAbandoned answers
// DataLoss, "outcome unknown", stored and replayed), whether a failing
// store lets handlers run unprotected, the logger and the observer. Each
// field's documentation is engine.Config's; a zero field is the engine's
// default, and NewServer refuses a configuration that engine.New refuses,
// with its message. A later WithConfig replaces an earlier one whole.
//
// The observer receives an engine.Event for every call of a protected
// method, those refused before any claim included (EventRejected: a key
// missing or malformed, a scope unusable, a streaming call with a key);
// its Status is the gRPC code. For OpenTelemetry, give it
// idemotel.GRPCServerObserver(), which reads Status as a gRPC code
// (idemotel.ServerObserver reads an HTTP status). For NewServer.
func WithConfig(cfg engine.Config) Option {
	return serverOption("WithConfig", func(c *serverConfig) { c.eng = cfg })
}

// WithKeep sets which error codes of a handler are kept: stored and
// replayed to every retry (true), or release the key so that a retry runs
// the handler again (false). By default every code is kept except
// Unavailable, Internal, Unknown, ResourceExhausted, Aborted,
// DeadlineExceeded and Canceled, which say that a retry may succeed. It is
// called after the handler ran, while the key is held: a panic in it is
// recovered and logged once, and the default decides. For NewServer.
func WithKeep(fn func(code codes.Code) bool) Option {
	return serverOption("WithKeep", func(c *serverConfig) {
		if fn == nil {
			c.refuse("WithKeep needs a function")
			return
		}
		c.keep = fn
	})
}

// defaultKeep keeps every code but those that say a retry may succeed.
func defaultKeep(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.ResourceExhausted,
		codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		return false
	}
	return true
}

// WithKeyOptional runs a protected call that comes without a key
// unprotected, instead of refusing it with InvalidArgument. For NewServer.
func WithKeyOptional() Option {
	return serverOption("WithKeyOptional", func(c *serverConfig) { c.optional = true })
}

// WithKeyFormat adds a check of the key's form (a UUID, say) to the
// built-in one (1 to 255 bytes of printable ASCII): a key fn refuses is
// answered InvalidArgument, with fn's error in the message. For NewServer.
func WithKeyFormat(fn func(key string) error) Option {
	return serverOption("WithKeyFormat", func(c *serverConfig) {
		if fn == nil {
			c.refuse("WithKeyFormat needs a function")
			return
		}
		c.keyFormat = fn
	})
}

// WithScope sets the function that names the caller a key belongs to, so
// that two callers' keys never meet. By default it is a hash of the
// authorization metadata ("" without it), as server.CredentialScope is of
// the HTTP credentials. An error from fn, or a scope longer than
// engine.MaxScopeLen, is answered InvalidArgument.
//
// Set it to the principal the application authenticated (an account ID that
// an interceptor placed before the Server's puts in the context) whenever
// callers send bearer tokens: a token refreshed between a call whose answer
// was lost and its retry puts the retry, under the default scope, in
// another caller's scope, where it runs again. The first call whose default
// scope comes from a bearer token is logged at warn level. For NewServer.
func WithScope(fn func(ctx context.Context, fullMethod string) (string, error)) Option {
	return serverOption("WithScope", func(c *serverConfig) {
		if fn == nil {
			c.refuse("WithScope needs a function")
			return
		}
		c.scope, c.scopeSet = fn, true
	})
}

// WithResponseType names the response message type of fullMethod, for
// replays of a method whose service is not in protoregistry.GlobalFiles
// (generated code registers its services there, so this is seldom needed).
// zero is any message of the type, such as (*pb.CreateReply)(nil). For
// NewServer.
func WithResponseType(fullMethod string, zero proto.Message) Option {
	return serverOption("WithResponseType", func(c *serverConfig) {
		if zero == nil {
			c.refuse("WithResponseType needs a message type for %s", fullMethod)
			return
		}
		c.types[fullMethod] = zero.ProtoReflect().Type()
	})
}

// WithMaxAttempts sets the largest number of attempts per call, including
// the first: 4 by default. 1 turns the interceptor's retries off (gRPC's
// own retryPolicy, if the service config has one, still carries the key);
// below 1 is an error. For UnaryClientInterceptor.
func WithMaxAttempts(n int) Option {
	return clientOption("WithMaxAttempts", func(c *clientConfig) {
		if n < 1 {
			c.refuse("max attempts %d is below 1", n)
			return
		}
		c.maxAttempts = n
	})
}

// WithBackoff sets the exponential backoff with full jitter: before retry n
// (from 0) the interceptor waits a random duration between 0 and
// min(limit, base·2ⁿ), 100ms and 5s by default. A base of 0 means no wait. A
// negative base, or a limit below the base, is an error. For
// UnaryClientInterceptor.
func WithBackoff(base, limit time.Duration) Option {
	return clientOption("WithBackoff", func(c *clientConfig) {
		if base < 0 || limit < base {
			c.refuse("backoff from %v to %v is not a range from 0 or more", base, limit)
			return
		}
		c.baseDelay, c.maxDelay = base, limit
	})
}

// WithMaxRetryAfter sets the longest wait that a server's retry delay (the
// RetryInfo detail sent with Aborted, the key in flight, and Unavailable,
// its store failing) can ask for: 30s by default; a longer one is cut to d.
// A d of 0 ignores the server's delay and uses the backoff; a negative d
// is an error. For UnaryClientInterceptor.
func WithMaxRetryAfter(d time.Duration) Option {
	return clientOption("WithMaxRetryAfter", func(c *clientConfig) {
		if d < 0 {
			c.refuse("max Retry-After %v is negative", d)
			return
		}
		c.maxRetryAfter = d
	})
}
