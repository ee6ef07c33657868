package consume

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
)

// Once returns a Func that runs effect through r: at most once per message
// ID while its record lives (engine.Config.TTL), with the message's data as the
// input that once fingerprints, so that an ID reused for other data is
// refused. effect gets the lease in its context (engine.LeaseFromContext):
// when Abandoned > 0 an earlier holder was lost, possibly after the effect,
// and effect must look for its own effect before it does it again.
func Once(r *once.Runner, effect Func) Func {
	return func(ctx context.Context, id engine.ID, data []byte) error {
		_, err := once.Do(ctx, r, id, data, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, effect(ctx, id, data)
		})
		return err
	}
}

// stored reports whether err is a permanent error of the effect
// (once.Permanent), stored by once, which every redelivery would only replay.
func stored(err error) bool { return errors.Is(err, once.ErrPermanent) }

// omitted reports whether the effect ran but once could not store its
// result: it is not run again, so the message is done.
func omitted(err error) bool { return errors.Is(err, engine.ErrResultOmitted) }

// invalidKey reports whether once refused the message ID (empty, or longer
// than 255 bytes).
func invalidKey(err error) bool { return errors.Is(err, once.ErrInvalidKey) }

// retryAfter returns when once said to try again (in flight, store
// unavailable).
func retryAfter(err error) (time.Duration, bool) {
	var e *once.Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		return e.RetryAfter, true
	}
	return 0, false
}
