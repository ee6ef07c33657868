package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/internal/jsoncodec"
)

// Defaults, and the shortest lease.
const (
	// defaultTTL is how long a record is kept.
	defaultTTL = 24 * time.Hour
	// defaultLease is the lease the work runs under, when the TTL is not
	// shorter.
	defaultLease = time.Minute
	// MinLease is the shortest lease, and so the shortest TTL, accepted.
	MinLease = 10 * time.Millisecond
	// defaultStoreTimeout bounds every Store call.
	defaultStoreTimeout = 5 * time.Second
	// defaultRetryAfter is how long a refused caller is told to wait before
	// it retries.
	defaultRetryAfter = time.Second
)

// MaxScopeLen is the longest ID.Scope a door hands the engine: every store
// keeps the scope beside the key, and a PostgreSQL index row holds about
// 8 KB. Doors refuse a longer one as an invalid request, rather than let the
// store fail on it every time.
const MaxScopeLen = 1024

// maxDuration is the longest TTL or lease given to a Store: longer ones are
// taken as it. A Store adds them to its clock, and a century is as good as
// forever while leaving that sum far from overflowing.
const maxDuration = 100 * 365 * 24 * time.Hour

// Config is how an Engine runs its calls. Its zero value is the defaults.
type Config struct {
	// TTL is how long a record is kept after the last moment its work may
	// have run: after its result was stored, or, while it is in flight,
	// after its lease's end (renewals move it), so that a retry within the
	// TTL after a lost holder's lease is told of that holder, whatever the
	// lease. 24 hours when 0; at least MinLease, and taken as 100
	// years when longer.
	TTL time.Duration
	// Lease is the lease the work holds while it runs, renewed every third
	// of its length until its result is stored: 1 minute when 0, or the
	// TTL when that is shorter. At least MinLease and no longer than the
	// TTL. When the lease's end, less a tenth of it, passes without a
	// successful renewal, the work's context is cancelled with a cause that
	// wraps ErrLeaseLost; the work never starts with less than that tenth
	// left.
	Lease time.Duration
	// StoreTimeout bounds every Store call: 5 seconds when 0.
	StoreTimeout time.Duration
	// Wait is how long a call whose key is in flight waits for the holder
	// to finish before it is refused with ErrInFlight: 0 does not wait.
	Wait time.Duration
	// RetryAfter is how long a refused caller is told to wait before it
	// retries (ErrInFlight, ErrStoreUnavailable): 1 second when
	// 0.
	RetryAfter time.Duration
	// Abandoned is what a call gets when it takes over a key whose earlier
	// holders were lost.
	Abandoned AbandonedPolicy
	// FailOpen runs the work unprotected when the store fails
	// (Door.Unprotected), instead of refusing it with ErrStoreUnavailable.
	FailOpen bool
	// Codec encodes what a door stores of its own values: the function
	// door's inputs and results, and every door's step inputs and results
	// (package step). JSON when nil; see Codec.
	Codec Codec
	// Logger receives the engine's log records, at most one a second per
	// message: slog.Default() when nil.
	Logger *slog.Logger
	// Observer, if set, receives an Event for each call and lease renewal.
	Observer Observer
}

// Engine runs the protocol for one Store. Its configuration is immutable,
// and it is safe for concurrent use. It owns the goroutines that store a
// result after it was answered (see Shutdown).
type Engine struct {
	store  Store
	binder Binder
	cfg    Config
	late   lateWork

	observerPanicked atomic.Bool
}

// New returns an engine that runs calls against store with cfg. A nil
// store, or a nil pointer in a Store interface, is refused, as is a
// configuration outside its bounds; the error names every invalid field.
func New(store Store, cfg Config) (*Engine, error) {
	if isNil(store) {
		return nil, errors.New("engine: New needs a Store, not a nil one")
	}
	var bad []error
	invalid := func(format string, args ...any) {
		bad = append(bad, fmt.Errorf("engine: "+format, args...))
	}
	switch {
	case cfg.TTL == 0:
		cfg.TTL = defaultTTL
	case cfg.TTL < MinLease:
		invalid("TTL %v is shorter than %v", cfg.TTL, MinLease)
	}
	cfg.TTL = min(cfg.TTL, maxDuration)
	switch {
	case cfg.Lease == 0:
		cfg.Lease = min(defaultLease, cfg.TTL)
	case cfg.Lease < MinLease:
		invalid("lease %v is shorter than %v", cfg.Lease, MinLease)
	}
	cfg.Lease = min(cfg.Lease, maxDuration)
	if cfg.Lease > cfg.TTL {
		invalid("lease %v is longer than TTL %v", cfg.Lease, cfg.TTL)
	}
	switch {
	case cfg.StoreTimeout == 0:
		cfg.StoreTimeout = defaultStoreTimeout
	case cfg.StoreTimeout < 0:
		invalid("store timeout %v is negative", cfg.StoreTimeout)
	}
	if cfg.Wait < 0 {
		invalid("wait %v is negative", cfg.Wait)
	}
	switch {
	case cfg.RetryAfter == 0:
		cfg.RetryAfter = defaultRetryAfter
	case cfg.RetryAfter < 0:
		invalid("Retry-After %v is negative", cfg.RetryAfter)
	}
	if cfg.Abandoned != RerunAbandoned && cfg.Abandoned != RefuseAbandoned {
		invalid("unknown abandoned policy %d", int(cfg.Abandoned))
	}
	if len(bad) > 0 {
		return nil, errors.Join(bad...)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Codec == nil {
		cfg.Codec = jsoncodec.Codec{}
	}
	cfg.Logger = slog.New(newRateLimited(cfg.Logger.Handler(), time.Second))
	e := &Engine{store: store, cfg: cfg}
	e.binder, _ = store.(Binder)
	return e, nil
}

// isNil reports whether store is nil, or holds a nil pointer, map, slice,
// func or channel: a Store whose every method would panic.
func isNil(store Store) bool {
	if store == nil {
		return true
	}
	switch v := reflect.ValueOf(store); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// Logger returns the engine's rate-limited logger, for a door's own records.
func (e *Engine) Logger() *slog.Logger { return e.cfg.Logger }

// Observe gives ev to the observer, if there is one: for a door's own
// events (a call refused before it reached the engine). A panic in the
// observer is recovered, and logged the first time only.
func (e *Engine) Observe(ctx context.Context, ev Event) {
	if e.cfg.Observer != nil {
		e.notify(ctx, ev)
	}
}

// notify calls the observer, which must be set. A panic in it must neither
// leave a key claimed (EventAcquired comes between the claim and the work)
// nor end the process (lease events run on a timer's goroutine), so it is
// recovered, and logged the first time only: an observer that panics once
// will panic on every call.
func (e *Engine) notify(ctx context.Context, ev Event) {
	defer func() {
		if v := recover(); v != nil && !e.observerPanicked.Swap(true) {
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idempotency observer panicked; its panics are recovered, and not logged again",
				slog.String("event", ev.Kind.String()), slog.String("panic", fmt.Sprint(v)))
		}
	}()
	e.cfg.Observer(ctx, ev)
}

// A Door is what a protocol (HTTP, a function call, gRPC) gives the engine
// for one call: how to run its work, and how to answer its caller. The
// engine calls exactly one answering method (Replay, Refuse, Send or
// Unprotected) once per call, except that Refuse may follow Execute (the
// store could not commit, or the work gave up without an answer).
type Door interface {
	// Replay answers the caller with resp, stored by an earlier run of
	// the request with the same fingerprint, and returns the status it
	// answered with, for the Event.
	Replay(resp *Response) (status int)
	// Refuse answers the caller with kind: ErrInFlight (retryAfter is
	// how long the holder's lease may last), ErrKeyMismatch, or
	// ErrStoreUnavailable (cause is the store's error, retryAfter is
	// Config.RetryAfter): nothing ran, or what ran was undone (a Binder's
	// transaction rolled back) or gave up without an answer. It returns
	// the status it answered with.
	Refuse(kind error, retryAfter time.Duration, cause error) (status int)
	// Execute runs the work once with ctx, which carries the Lease
	// (LeaseFromContext) and is cancelled, with a cause that wraps
	// ErrLeaseLost, when the lease is lost, and says what to keep of it. A
	// panic in it releases the key and goes on.
	Execute(ctx context.Context) Outcome
	// Send answers the caller with what Execute (or OutcomeUnknown)
	// produced: after it was stored, or, while the store is failing,
	// before it is stored, in the background. With now set the store
	// write goes on on this goroutine after Send returns, so the caller
	// must be answered at once (an HTTP/1 door closes the connection).
	Send(now bool)
	// OutcomeUnknown returns the record kept under RefuseAbandoned for a
	// key whose earlier holders were lost. It must carry the HeaderOutcome
	// header with the value "unknown"; once it is stored the engine
	// answers it with Send. If it cannot be stored, the engine calls
	// Refuse with ErrStoreUnavailable instead.
	OutcomeUnknown() *Response
	// Unprotected runs the work without protection, for Config.FailOpen
	// when the store failed.
	Unprotected()
}

// Outcome is what Door.Execute kept of the work.
type Outcome struct {
	// Response is what to store and replay; nil releases the key, so that
	// the next call with it runs the work again.
	Response *Response
	// Status is the status of the answer, for the Event.
	Status int
	// Reason says why the key is released, when Response is nil.
	Reason string
	// Sent reports that the answer already went out (a streamed HTTP
	// response): Send is not called for it.
	Sent bool
	// Cause, when set, says that the work gave up without an answer
	// because its context ended (context.Cause): the key is released, and
	// the caller, if it is still there, is refused with
	// ErrStoreUnavailable.
	Cause error
}
