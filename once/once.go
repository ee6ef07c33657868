// Package once runs a function at most once per idempotency key, on any
// Store, and gives every later call with the key the function's stored
// result: the door of the idempotency engine for jobs, scheduled tasks and
// queue consumers, where duplicates are the default (a broker redelivers
// whatever was not acknowledged).
//
//	r, err := once.New(store)
//	...
//	order, err := once.Do(ctx, r, engine.ID{Scope: "orders", Key: msgID}, msg.Data,
//		func(ctx context.Context) (Order, error) { return placeOrder(ctx, msg.Data) })
//
// It is the protocol that the HTTP middleware runs, and the same store
// serves both: one execution per key, under a lease that is renewed while
// the function runs and fenced by a token (engine.LeaseFromContext), the
// result stored or the key released, the takeover of a lost holder
// reported, and a result stored after it was returned when the store is
// slow.
//
// # What a call gets
//
//   - The first call with a key runs fn. Its value is encoded with the
//     codec (engine.Config.Codec, JSON by default) and stored; a later call with the key
//     and the same input gets the stored value decoded, without running fn.
//   - The input is fingerprinted (encoded with the codec, then SHA-256): a
//     later call with the key and another input gets an error wrapping
//     engine.ErrKeyMismatch, and fn does not run. The default codec, JSON,
//     refuses an input or a result holding a string that is not valid
//     UTF-8, which encoding/json would change: such an input is
//     refused before anything is claimed, and such a result is recorded
//     without its value (engine.ErrResultOmitted), never replayed changed.
//   - While fn runs elsewhere with the key, a call waits up to the
//     configuration's Wait (WithConfig) for its result, then gets an error wrapping engine.ErrInFlight.
//   - When the store fails, a call gets an error wrapping
//     engine.ErrStoreUnavailable, and fn does not run: the door fails
//     closed.
//   - Under engine.RefuseAbandoned (WithConfig), a call that takes over a
//     key whose earlier holder was lost gets an error wrapping
//     engine.ErrOutcomeUnknown, recorded for every later call, and fn does
//     not run.
//
// Every refusal is an [*Error]; its RetryAfter says when to try again. A
// call whose key is empty or longer than 255 bytes, whose scope is longer
// than engine.MaxScopeLen, or whose
// input cannot be encoded is refused before anything is claimed, with an
// error wrapping ErrInvalidKey or the codec's error; the observer is told
// of it (engine.EventRejected, status 400), as of every other call.
//
// # The scope
//
// id.Scope names whose key it is, so that two owners' keys never meet: the
// account or tenant the work is for, or the consumer whose effect it is
// (examples/jetstream/consume uses the stream and the durable consumer).
// Take it from the authenticated principal, never from a credential: a
// bearer token refreshed between a call that was lost and its retry would
// put the retry in another scope, where fn runs again.
//
// # Errors of fn
//
// As the HTTP middleware stores a 4xx and releases the key on a 5xx, an
// error that fn returns releases the key by default, so that the next call
// runs fn again: it is a failure to retry (a timeout, an unavailable
// dependency). An error wrapped with [Permanent] (or one that WithKeep
// says to keep) is stored instead, like a 4xx: every later call with the
// key gets a [*StoredError] with its message, and fn does not run again.
// Both match errors.Is(err, ErrPermanent), even when the store kept the
// error's status but not its message (too large: StoredError.Omitted). The
// caller that ran fn gets fn's error itself, unchanged, either way, unless
// fn's context ended first: a caller that went away gets its context's
// error, and one whose lease was lost an [*Error] wrapping
// engine.ErrStoreUnavailable (fn ran, but gave up, and the key was
// released), so that it calls again.
//
// A panic in fn releases the key and goes on to the caller; a panic in the
// codec encoding fn's result is taken as its error (the call is recorded
// without its value).
package once

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/jsoncodec"
)

// maxKeyLen is the longest key accepted, as the HTTP middleware accepts.
const maxKeyLen = 255

// The statuses a record of this door holds (Response.Status), and that its
// Events report (WithConfig lists them): those of the HTTP middleware for the same outcomes, so
// that one observer reads both.
const (
	// statusValue: fn returned a value, stored in the record's body.
	statusValue = 200
	// statusError: fn returned a permanent error, whose message is the
	// record's body.
	statusError = 400
	// statusFailed: fn returned an error that released the key (reported
	// in the Event only: nothing is stored).
	statusFailed = 500
	// statusInFlight, statusMismatch and statusUnavailable are the
	// refusals' statuses (engine.ErrInFlight, engine.ErrKeyMismatch,
	// engine.ErrStoreUnavailable).
	statusInFlight    = 409
	statusMismatch    = 422
	statusUnavailable = 503
	// statusOutcomeUnknown: the "outcome unknown" record
	// (engine.RefuseAbandoned).
	statusOutcomeUnknown = 409
	// statusInvalid: a call refused before any claim (EventRejected): its
	// key or scope is invalid, its input cannot be encoded, or it has no
	// function.
	statusInvalid = 400
)

// ErrInvalidKey is what a call whose key is empty or longer than 255 bytes,
// or whose scope is longer than engine.MaxScopeLen,
// gets, wrapped; fn does not run.
var ErrInvalidKey = errors.New("idempotency key invalid")

// ErrPermanent is matched (errors.Is) by an error that fn returned wrapped
// with Permanent, and by its replays, the [*StoredError]s.
var ErrPermanent = errors.New("permanent error")

// Runner runs functions once per key against one Store. Create one with
// New; it is safe for concurrent use.
type Runner struct {
	engine   *engine.Engine
	codec    engine.Codec
	keep     func(error) bool
	observed bool // an observer is set: calls are timed for it

	keepPanicked atomic.Bool // keep panicked, and it was logged
}

// New returns a Runner that keeps its records in store. The options are
// checked: an invalid one is an error that names every invalid option. A nil
// store is refused.
func New(store engine.Store, opts ...Option) (*Runner, error) {
	cfg := config{keep: isPermanent}
	for i, o := range opts {
		if o == nil {
			cfg.invalid("option %d is nil", i)
			continue
		}
		o(&cfg)
	}
	e, err := engine.New(store, cfg.engine)
	if err != nil {
		cfg.bad = append(cfg.bad, fmt.Errorf("once: %w", err))
	}
	if err := errors.Join(cfg.bad...); err != nil {
		return nil, err
	}
	codec := cfg.engine.Codec
	if codec == nil {
		codec = jsoncodec.Codec{}
	}
	return &Runner{engine: e, codec: codec, keep: cfg.keep, observed: cfg.engine.Observer != nil}, nil
}

// Shutdown waits for the results that are being stored after they were
// returned (a Complete that failed within the store timeout goes on in the
// background, for one lease at most), or until ctx ends; see
// engine.Engine.Shutdown. Call it once no Do is running.
//
// After Shutdown the Runner goes on running calls, but a result that the
// store does not take within the store timeout is stored on the call's own
// goroutine: Do returns once it is stored or a lease has passed, whatever
// its ctx says (a function cannot answer its caller and go on). The same
// holds beyond 1024 results being stored at once, or 64 MiB of them.
func (r *Runner) Shutdown(ctx context.Context) error {
	if err := r.engine.Shutdown(ctx); err != nil {
		return fmt.Errorf("once: shutdown: %w", ctx.Err())
	}
	return nil
}

// Do runs fn at most once for id while its record lives (the TTL), and
// returns its value, or the value stored by the call that ran it. The
// package documentation says what every outcome returns. ctx is the
// caller's: fn runs with a context derived from it that carries the lease
// (engine.LeaseFromContext) and is cancelled, with a cause that wraps
// engine.ErrLeaseLost, when the lease is lost; the store calls keep ctx's
// values but not its cancellation. A caller whose ctx ends before fn runs
// gets ctx's error, and nothing is left claimed.
func Do[T any](ctx context.Context, r *Runner, id engine.ID, input any, fn func(context.Context) (T, error)) (T, error) {
	v, _, err := DoResult(ctx, r, id, input, fn)
	return v, err
}

// DoResult is Do that also reports whether the value was replayed from the
// store rather than computed by this call.
func DoResult[T any](ctx context.Context, r *Runner, id engine.ID, input any, fn func(context.Context) (T, error)) (value T, replayed bool, err error) {
	var zero T
	var start time.Time
	if r.observed {
		start = time.Now()
	}
	if id.Key == "" || len(id.Key) > maxKeyLen {
		return zero, false, r.reject(ctx, start, engine.ID{}, fmt.Errorf("once: key of %d bytes: %w (1 to %d bytes)", len(id.Key), ErrInvalidKey, maxKeyLen))
	}
	if len(id.Scope) > engine.MaxScopeLen {
		return zero, false, r.reject(ctx, start, engine.ID{Key: id.Key}, fmt.Errorf("once: scope of %d bytes: %w (at most %d bytes)", len(id.Scope), ErrInvalidKey, engine.MaxScopeLen))
	}
	if fn == nil {
		return zero, false, r.reject(ctx, start, id, errors.New("once: Do needs a function"))
	}
	encoded, err := r.codec.Marshal(input)
	if err != nil {
		return zero, false, r.reject(ctx, start, id, fmt.Errorf("once: input cannot be encoded for its fingerprint: %w", err))
	}
	sum := sha256.Sum256(append([]byte("once\n"), encoded...))
	d := &door[T]{r: r, ctx: ctx, fn: fn}
	d.call.Start = start
	r.engine.Do(ctx, &d.call, id, string(sum[:]), d)
	if !d.answered {
		// The caller went away before fn ran: nothing ran, and nothing
		// is left claimed.
		if err := ctx.Err(); err != nil {
			return zero, false, fmt.Errorf("once: %w", err)
		}
		return zero, false, errors.New("once: call not answered")
	}
	return d.value, d.replayed, d.err
}

// reject tells the observer of a call refused before any claim, and returns
// err, what the caller gets. id names what is known to be valid of the
// call's ID: nothing of an invalid key or scope.
func (r *Runner) reject(ctx context.Context, start time.Time, id engine.ID, err error) error {
	r.engine.Observe(ctx, engine.Event{Kind: engine.EventRejected, Scope: id.Scope, Key: id.Key, Status: statusInvalid, Start: start, Err: err})
	return err
}

// door is one call of Do, as the engine sees it.
type door[T any] struct {
	call engine.Call
	r    *Runner
	ctx  context.Context // the caller's
	fn   func(context.Context) (T, error)

	answered bool
	value    T
	err      error // what the caller gets
	replayed bool
}

func (d *door[T]) Replay(resp *engine.Response) int {
	d.answered, d.replayed = true, true
	switch {
	case resp.OutcomeUnknown():
		d.err = &Error{kind: engine.ErrOutcomeUnknown}
	case resp.Status == statusError:
		// Decided by the status before the body: a permanent error
		// whose message the store dropped failed for good all the
		// same.
		d.err = &StoredError{Message: string(resp.Body), Omitted: resp.BodyOmitted}
	case resp.BodyOmitted:
		d.err = fmt.Errorf("once: %w", engine.ErrResultOmitted)
	case resp.Status == statusValue:
		if err := d.r.codec.Unmarshal(resp.Body, &d.value); err != nil {
			d.err = fmt.Errorf("once: stored result cannot be decoded: %w", err)
		}
	default:
		d.err = fmt.Errorf("once: stored record has status %d, not one of this door's", resp.Status)
	}
	return resp.Status
}

func (d *door[T]) Refuse(kind error, retryAfter time.Duration, cause error) int {
	var zero T
	d.answered, d.value = true, zero
	d.err = &Error{kind: kind, RetryAfter: retryAfter, cause: cause}
	switch kind {
	case engine.ErrInFlight:
		return statusInFlight
	case engine.ErrKeyMismatch:
		return statusMismatch
	}
	return statusUnavailable
}

func (d *door[T]) Execute(ctx context.Context) engine.Outcome {
	v, err := d.fn(ctx)
	d.value, d.err = v, err
	if err != nil {
		if (gaveUp(ctx, err) && !isPermanent(err)) || !d.stores(ctx, err) {
			if ctx.Err() != nil {
				// fn gave up because its context ended: the lease
				// was lost, or the caller went away.
				return engine.Outcome{Reason: "the function failed after its context ended", Cause: context.Cause(ctx)}
			}
			return engine.Outcome{Status: statusFailed, Reason: "the function failed: " + err.Error()}
		}
		return engine.Outcome{Status: statusError, Response: &engine.Response{Status: statusError, Body: []byte(err.Error())}}
	}
	body, merr := marshal(d.r.codec, v)
	if merr != nil {
		d.r.engine.Logger().LogAttrs(ctx, slog.LevelError, "once: result cannot be encoded; recording the call as done without it",
			slog.String("key", d.call.Lease().Key), slog.Any("error", merr))
		return engine.Outcome{Status: statusValue, Response: &engine.Response{Status: statusValue, BodyOmitted: true}}
	}
	return engine.Outcome{Status: statusValue, Response: &engine.Response{Status: statusValue, Body: body}}
}

// marshal encodes v with codec, a panic in it (a type's own MarshalJSON,
// say) taken as its error: fn has run, and a panic here must not release
// the key for the retry to run it again.
func marshal(codec engine.Codec, v any) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("codec panicked: %v", p)
		}
	}()
	return codec.Marshal(v)
}

// gaveUp reports whether err, returned by fn, is its context's own error
// after that context ended: the caller went away, or the lease was lost.
// Such an error says nothing of the work, and stored it would be replayed to
// the very retry that should run fn, so it releases the key whatever
// WithKeep says, unless fn marked it Permanent.
func gaveUp(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, ctx.Err()) || errors.Is(err, context.Cause(ctx)))
}

// stores reports whether fn's error err is stored, by WithStoreError's
// function; a panic in it is recovered, logged once, and Permanent decides.
func (d *door[T]) stores(ctx context.Context, err error) (store bool) {
	defer func() {
		if v := recover(); v != nil {
			if !d.r.keepPanicked.Swap(true) {
				d.r.engine.Logger().LogAttrs(ctx, slog.LevelError, "once: store error function panicked; Permanent decides instead, and its panics are not logged again",
					slog.String("panic", fmt.Sprint(v)))
			}
			store = isPermanent(err)
		}
	}()
	return d.r.keep(err)
}

// Send: the caller gets what Execute (or OutcomeUnknown) left, when Do
// returns.
func (d *door[T]) Send(bool) { d.answered = true }

func (d *door[T]) OutcomeUnknown() *engine.Response {
	var zero T
	d.value = zero
	d.err = &Error{kind: engine.ErrOutcomeUnknown}
	return &engine.Response{Status: statusOutcomeUnknown, Header: map[string][]string{engine.HeaderOutcome: {"unknown"}}}
}

// Unprotected runs fn without protection. The door never asks the engine
// to fail open, so the engine never calls it; it is here for the Door
// interface.
func (d *door[T]) Unprotected() {
	d.answered = true
	d.value, d.err = d.fn(d.ctx)
}
