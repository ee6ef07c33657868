package once

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Option configures a Runner. Options are applied in order, a later one
// overriding an earlier one of the same kind; New refuses an invalid one (a
// nil Option included) with an error that names every invalid option.
type Option func(*config)

type config struct {
	engine engine.Config
	keep   func(error) bool
	bad    []error
}

func (c *config) invalid(format string, args ...any) {
	c.bad = append(c.bad, fmt.Errorf("once: "+format, args...))
}

// WithConfig sets the engine's configuration, the same for every door:
// how long a record is kept (TTL; for a queue consumer it must outlive the
// broker's redelivery window), the lease fn runs under and how it is
// renewed, the bound of every store call, how long a call whose key is in
// flight waits for the holder (then its error wraps engine.ErrInFlight),
// the RetryAfter of a refusal, the codec of inputs and results (JSON by
// default: engine.Codec says what a codec must be; results must round-trip
// through it), what a takeover of an abandoned key gets
// (engine.RerunAbandoned runs fn again, which must then look for its own
// effect: engine.LeaseFromContext reports Abandoned > 0;
// engine.RefuseAbandoned records an "outcome unknown" error instead), the
// logger and the observer. Each field's documentation is engine.Config's;
// a zero field is the engine's default, and New refuses a configuration
// that engine.New refuses, with its message. A later WithConfig replaces an
// earlier one whole.
//
// The observer's engine.Event reports, as Status, the status of the HTTP
// middleware for the same outcome (200 for a value, 400 for a permanent
// error or a call refused before any claim, 500 for an error that released
// the key, 409, 422, 503 for the refusals), so that one observer reads
// every door. Config.FailOpen runs fn unprotected when the store fails.
func WithConfig(cfg engine.Config) Option {
	return func(c *config) { c.engine = cfg }
}

// WithKeep sets the function that decides whether an error of fn is kept,
// stored and replayed to every later call (true), or releases the key so
// that the next call runs fn again (false). By default only errors wrapped
// with Permanent are kept. A panic in it is recovered, and the default
// decides. An error that is fn's context's own (it wraps ctx.Err() or
// context.Cause(ctx)), returned after that context ended, always releases
// the key unless it is Permanent: the caller went away or the lease was
// lost, and the retry must run fn.
func WithKeep(fn func(err error) bool) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithKeep needs a function")
			return
		}
		c.keep = fn
	}
}

// Error is a refusal: the call was answered without running fn (or what ran
// was undone). It wraps one of engine.ErrInFlight, engine.ErrKeyMismatch,
// engine.ErrStoreUnavailable and engine.ErrOutcomeUnknown, which
// errors.Is matches, and, for a store failure, the store's error.
type Error struct {
	// RetryAfter, when positive, is how long to wait before calling again
	// (engine.ErrInFlight, engine.ErrStoreUnavailable).
	RetryAfter time.Duration

	kind  error // the protocol's answer
	cause error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return "once: " + e.kind.Error() + ": " + e.cause.Error()
	}
	return "once: " + e.kind.Error()
}

// Unwrap returns the protocol's answer and, for a store failure, the store's error.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// StoredError is a permanent error of fn, replayed from the store to a later
// call with the key: it has the original's message (unless the store did not
// keep it), and matches ErrPermanent.
type StoredError struct {
	Message string
	// Omitted reports that the store kept the error's status but not its
	// message, which was too large: Message is empty.
	Omitted bool
}

func (e *StoredError) Error() string {
	if e.Omitted {
		return "once: permanent error, whose message was too large to store"
	}
	return e.Message
}

// Unwrap returns ErrPermanent.
func (e *StoredError) Unwrap() error { return ErrPermanent }

// Permanent marks err as a permanent failure of fn: it is stored and
// replayed to every later call with the key, as the HTTP middleware stores
// a 4xx, instead of releasing the key. The result matches both err and
// ErrPermanent; Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanent{err}
}

type permanent struct{ err error }

func (p *permanent) Error() string   { return p.err.Error() }
func (p *permanent) Unwrap() []error { return []error{p.err, ErrPermanent} }

func isPermanent(err error) bool { return errors.Is(err, ErrPermanent) }
