package redisstore

import (
	"errors"
	"fmt"
	"log/slog"
)

// Option configures a Store. New refuses an invalid one (a nil Option
// included) with an error that names every invalid option at once.
type Option func(*config)

type config struct {
	prefix  string
	logger  *slog.Logger // nil: slog.Default() as it is when Open logs
	strict  bool
	ack     replicaAck
	invalid []error
}

// refuse records an invalid option, for New to report with the others.
func (c *config) refuse(format string, args ...any) {
	c.invalid = append(c.invalid, fmt.Errorf("redisstore: "+format, args...))
}

func newConfig(opts []Option) (config, error) {
	c := config{prefix: defaultPrefix}
	for i, o := range opts {
		if o == nil {
			c.refuse("option %d is nil", i)
			continue
		}
		o(&c)
	}
	return c, errors.Join(c.invalid...)
}

// WithPrefix sets the prefix of every key the Store writes, "idempotency:"
// by default, so that a Redis can hold other data, or the records of several
// APIs, side by side. Stores that share records must share the prefix. A
// prefix with a Cluster hash tag ("{idem}:") puts every record on one node.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithLogger sets the logger that [Open] tells what it found, slog.Default()
// by default. The Store logs nothing else. A nil logger is refused, as it is
// by the middleware's WithLogger: to log nothing, pass
// slog.New(slog.DiscardHandler).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.refuse("WithLogger needs a logger")
			return
		}
		c.logger = l
	}
}

// WithStrictEviction makes [Open] refuse a Redis that may evict the Store's
// records, or whose eviction policy it cannot read, rather than log it.
func WithStrictEviction() Option {
	return func(c *config) { c.strict = true }
}
