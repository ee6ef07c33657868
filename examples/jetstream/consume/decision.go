package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
)

// Action is what a Handler tells the broker about a message.
type Action int

const (
	// Ack acknowledges the message: its effect ran (now or before) and its
	// result is stored, so a redelivery would only replay it.
	Ack Action = iota + 1
	// Nak asks for the message again after Decision.Delay: nothing was
	// stored (the effect failed and its key was released, the store is
	// unavailable, or another holder is running it right now).
	Nak
	// Term tells the broker never to deliver the message again: its outcome
	// is final but not a success (a stored permanent error, a Nats-Msg-Id
	// reused for other data, no Nats-Msg-Id, an outcome unknown after a lost
	// holder). The server publishes a MSG_TERMINATED advisory for it, which
	// an operator or a dead-letter consumer can watch; log Decision.Reason.
	Term
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case Term:
		return "term"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is what a Handler decided for one message.
type Decision struct {
	Action Action
	// Delay is how long the broker should wait before it delivers the
	// message again (Nak).
	Delay time.Duration
	// Reason says why the message is terminated (Term), for the log.
	Reason string
	// Err is the error of the Func, or why the message could not be run.
	Err error
}

// Settle tells the broker about msg what d says.
func (d Decision) Settle(msg jetstream.Msg) error {
	var err error
	switch d.Action {
	case Ack:
		err = msg.Ack()
	case Nak:
		if d.Delay > 0 {
			err = msg.NakWithDelay(d.Delay)
		} else {
			err = msg.Nak()
		}
	case Term:
		// Not TermWithReason: a server older than 2.10.4 (Debian's
		// nats-server is 2.9.10) does not know it and delivers the
		// message again at once. Log d.Reason instead.
		err = msg.Term()
	default:
		return fmt.Errorf("consume: settle: unknown action %v", d.Action)
	}
	if err != nil {
		return fmt.Errorf("consume: %v: %w", d.Action, err)
	}
	return nil
}

// Decide says what to tell the broker after the Func returned err for a
// message handled with ctx.
func (h *Handler) Decide(ctx context.Context, err error) Decision {
	switch {
	case err == nil:
		return Decision{Action: Ack}
	case stored(err) || h.cfg.isFinal(err):
		// A permanent error that the door stored: every redelivery
		// would replay it. Decided before omitted: a permanent error
		// whose message the store did not keep failed all the same.
		return Decision{Action: Term, Reason: "permanent: " + err.Error(), Err: err}
	case omitted(err):
		// The effect ran; only its result could not be stored, and once
		// will not run it again.
		return Decision{Action: Ack, Err: err}
	case invalidKey(err):
		return Decision{Action: Term, Reason: "message ID not usable as an idempotency key", Err: err}
	case errors.Is(err, engine.ErrKeyMismatch):
		// The publisher reused a message ID for other data: running it
		// again can never succeed. Term publishes an advisory, so the
		// second message is not dropped unseen.
		return Decision{Action: Term, Reason: "message ID reused for other data", Err: err}
	case errors.Is(err, engine.ErrOutcomeUnknown):
		// An earlier holder was lost after it may have run the effect,
		// and the door refuses to guess: an operator must look.
		return Decision{Action: Term, Reason: "outcome unknown: an earlier holder was lost", Err: err}
	}
	// Nothing is stored: the effect failed and its key was released, the
	// store is unavailable, another holder is running the message (in
	// flight), or ctx ended. A redelivery runs it again.
	d := Decision{Action: Nak, Delay: h.cfg.retryDelay, Err: err}
	if after, ok := retryAfter(err); ok && after > d.Delay {
		// The door knows when the holder's lease ends, or when the store
		// is worth trying again.
		d.Delay = after
	}
	if ctx.Err() != nil {
		// Shutting down: let another instance have it at once.
		d.Delay = 0
	}
	return d
}
