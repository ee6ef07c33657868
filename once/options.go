package once

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Option configures a Runner. Options are applied in order, a later one
// overriding an earlier one of the same kind; New refuses an invalid one (a
// nil Option included) with an error that names every invalid option.
type Option func(*config)

type config struct {
	engine   engine.Config
	codec    Codec
	storeErr func(error) bool
	bad      []error
}

func (c *config) invalid(format string, args ...any) {
	c.bad = append(c.bad, fmt.Errorf("once: "+format, args...))
}

// positive records d in *field, or refuses it when it is not positive.
func (c *config) positive(field *time.Duration, name string, d time.Duration) {
	if d <= 0 {
		c.invalid("%s %v is not positive", name, d)
		return
	}
	*field = d
}

// WithTTL sets how long a record is kept after the last moment fn may have
// run, engine.DefaultTTL (24 hours) by default: after its result was
// stored, or, while it is in flight, after its lease's end, so that a call
// that takes over the key of a lost holder is told of it whatever the TTL
// and the lease. A call with the key after that runs fn again. For a queue
// consumer it must outlive the broker's redelivery window. At least
// engine.MinLease; taken as 100 years when longer.
func WithTTL(d time.Duration) Option {
	return func(c *config) { c.positive(&c.engine.TTL, "TTL", d) }
}

// WithLease sets the lease fn holds while it runs, engine.DefaultLease (one
// minute) by default, or the TTL when that is shorter. It is renewed every
// third of its length until the result is stored; when it ends unrenewed,
// fn's context is cancelled with a cause that wraps engine.ErrLeaseLost, and
// another call may take the key over, told of the lost holder
// (Lease.Abandoned, or engine.ErrOutcomeUnknown under RefuseAbandoned) for
// the TTL after the lease's end.
func WithLease(d time.Duration) Option {
	return func(c *config) { c.positive(&c.engine.Lease, "lease", d) }
}

// WithStoreTimeout bounds every Store call, engine.DefaultStoreTimeout (5
// seconds) by default.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) { c.positive(&c.engine.StoreTimeout, "store timeout", d) }
}

// WithRetryAfter sets the RetryAfter of a refusal for a store failure, and
// the most that of an in-flight refusal says: engine.DefaultRetryAfter (one
// second) by default.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) { c.positive(&c.engine.RetryAfter, "Retry-After", d) }
}

// WithWait makes a call whose key is in flight wait up to d for the holder
// to finish, and return its result; a call still waiting after d gets an
// error wrapping engine.ErrInFlight. 0, the default, does not wait.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.invalid("wait %v is negative", d)
			return
		}
		c.engine.Wait = d
	}
}

// WithAbandoned sets what a call gets when it takes over a key whose
// earlier holder was lost (its process died, hung, or lost its store):
// engine.RerunAbandoned (the default) runs fn again, which must then look
// for its own effect (engine.LeaseFromContext reports Abandoned > 0);
// engine.RefuseAbandoned records an "outcome unknown" error instead.
func WithAbandoned(p engine.AbandonedPolicy) Option {
	return func(c *config) {
		if p != engine.RerunAbandoned && p != engine.RefuseAbandoned {
			c.invalid("WithAbandoned: unknown policy %d", int(p))
			return
		}
		c.engine.Abandoned = p
	}
}

// WithObserver sets a function told of every call and lease renewal, as
// the HTTP middleware's observer is (engine.Event; its Status is one of
// this package's Status constants), a call refused before any claim
// included (engine.EventRejected, StatusInvalid). A panic in it is
// recovered, and logged the first time only.
func WithObserver(fn engine.Observer) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithObserver needs a function")
			return
		}
		c.engine.Observer = fn
	}
}

// WithLogger sets the logger, slog.Default() by default. Records are
// limited to one a second per message.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.invalid("WithLogger needs a logger")
			return
		}
		c.engine.Logger = l
	}
}

// WithCodec sets how inputs are encoded for their fingerprint and results
// for the store, JSON by default. It must be deterministic and lossless
// (see Codec): results must round-trip through it.
func WithCodec(codec Codec) Option {
	return func(c *config) {
		if codec == nil {
			c.invalid("WithCodec needs a Codec")
			return
		}
		c.codec = codec
	}
}

// WithStoreError sets the function that decides whether an error of fn is
// stored and replayed (true) or releases the key so that the next call
// runs fn again (false). By default only errors wrapped with Permanent are
// stored. A panic in it is recovered, and the default decides. An error
// that is fn's context's own (it wraps ctx.Err() or context.Cause(ctx)),
// returned after that context ended, always releases the key unless it is
// Permanent: the caller went away or the lease was lost, and the retry must
// run fn.
func WithStoreError(fn func(error) bool) Option {
	return func(c *config) {
		if fn == nil {
			c.invalid("WithStoreError needs a function")
			return
		}
		c.storeErr = fn
	}
}

// Error is a refusal: the call was answered without running fn (or what ran
// was undone). It wraps Kind, one of engine.ErrInFlight,
// engine.ErrKeyMismatch, engine.ErrStoreUnavailable and
// engine.ErrOutcomeUnknown, and, for a store failure, the store's error.
type Error struct {
	// Kind is the protocol's answer.
	Kind error
	// RetryAfter, when positive, is how long to wait before calling again
	// (ErrInFlight, ErrStoreUnavailable).
	RetryAfter time.Duration

	cause error
}

func (e *Error) Error() string {
	if e.cause != nil {
		return "once: " + e.Kind.Error() + ": " + e.cause.Error()
	}
	return "once: " + e.Kind.Error()
}

// Unwrap returns Kind and, for a store failure, the store's error.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.Kind, e.cause}
	}
	return []error{e.Kind}
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
