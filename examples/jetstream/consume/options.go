package consume

import (
	"errors"
	"fmt"
	"time"
)

// Option configures a Handler.
type Option func(*config)

type config struct {
	scope      string
	seqKey     bool
	retryDelay time.Duration
	progress   time.Duration
	final      []func(error) bool
	errs       []error
}

func (c *config) invalid(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("consume: "+format, args...))
}

func (c *config) isFinal(err error) bool {
	for _, f := range c.final {
		if f(err) {
			return true
		}
	}
	return false
}

// WithScope makes scope the Scope of every message's ID, instead of the
// stream and consumer names. Use it when the consumer's name is not stable,
// or to keep the records of a consumer that is renamed.
func WithScope(scope string) Option {
	return func(c *config) {
		if scope == "" {
			c.invalid("empty scope")
		}
		c.scope = scope
	}
}

// WithSequenceKey keys a message without a Nats-Msg-Id header by its stream
// sequence ("seq:42") instead of terminating it. That protects against
// redeliveries of the message only: the same event published twice, or
// copied to another stream, gets another sequence and runs again.
func WithSequenceKey() Option {
	return func(c *config) { c.seqKey = true }
}

// WithRetryDelay sets how long the broker waits before it delivers again a
// message that was not stored (default 1 s). Zero asks for it at once.
func WithRetryDelay(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.invalid("negative retry delay %v", d)
		}
		c.retryDelay = d
	}
}

// WithProgress tells the server every d that a message is still in progress
// while its Func runs, so that a long effect is not redelivered to another
// instance after AckWait. d should be well under the consumer's AckWait.
// Zero (the default) sends none: a redelivery during a long effect is then
// answered by the door as in flight, and delivered again later.
func WithProgress(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.invalid("negative progress interval %v", d)
		}
		c.progress = d
	}
}

// WithFinal makes the errors for which final returns true terminate the
// message instead of asking for it again, besides those that once stored
// and replays (once.ErrPermanent), which always do: for a Func that is not
// once.Do, or errors that no redelivery can cure.
func WithFinal(final func(error) bool) Option {
	return func(c *config) {
		if final == nil {
			c.errs = append(c.errs, errors.New("consume: nil final function"))
			return
		}
		c.final = append(c.final, final)
	}
}
