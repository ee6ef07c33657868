package pgstore

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults of the options.
const (
	// defaultLockTimeout bounds how long, in transactional mode, a Claim
	// waits for a concurrent transaction holding the same key.
	defaultLockTimeout = 2 * time.Second
	// defaultIdleTimeout is how long, in transactional mode, a transaction
	// may sit idle before PostgreSQL ends its session and rolls it back.
	defaultIdleTimeout = time.Minute
	// minIdleTimeout is the shortest idle timeout [WithIdleTimeout] sets.
	minIdleTimeout = 100 * time.Millisecond
	// defaultSweepBatch is the number of records that one statement of a
	// sweep deletes, when [WithSweeper] is given no batch.
	defaultSweepBatch = 1000
)

// Option configures a Store. New refuses an invalid one (a nil Option
// included) with an error that names every invalid option at once.
type Option func(*config)

type config struct {
	table         string
	transactional bool
	lockTimeout   time.Duration
	idleTimeout   time.Duration
	sweepInterval time.Duration
	sweepBatch    int
	logger        *slog.Logger
	invalid       []error
}

// refuse records an invalid option, for New to report with the others.
func (c *config) refuse(format string, args ...any) {
	c.invalid = append(c.invalid, fmt.Errorf("pgstore: "+format, args...))
}

func newConfig(opts []Option) (config, error) {
	c := config{
		table:       defaultTable,
		lockTimeout: defaultLockTimeout,
		idleTimeout: defaultIdleTimeout,
		sweepBatch:  defaultSweepBatch,
	}
	for i, o := range opts {
		if o == nil {
			c.refuse("option %d is nil", i)
			continue
		}
		o(&c)
	}
	if c.lockTimeout < time.Millisecond {
		c.refuse("lock timeout %v: want at least a millisecond", c.lockTimeout)
	}
	if c.idleTimeout < 0 {
		c.refuse("idle timeout %v: want zero (none) or more", c.idleTimeout)
	}
	if c.sweepInterval < 0 {
		c.refuse("sweep interval %v: want zero (no sweeper) or more", c.sweepInterval)
	}
	if _, err := parseTable(c.table); err != nil {
		// parseTable's error carries the package prefix already.
		c.invalid = append(c.invalid, err)
	}
	if err := errors.Join(c.invalid...); err != nil {
		return c, err
	}
	if c.idleTimeout > 0 {
		c.idleTimeout = max(c.idleTimeout, minIdleTimeout)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// WithTable names the table that holds the records, "table" or
// "schema.table", instead of "idempotency_records". Each part must be a plain
// identifier (letters, digits and underscores, not starting with a digit);
// it is quoted, so it is used exactly as given, case included. The table's
// token sequence and sweep index are named after it, with the suffixes
// "_token_seq" and "_sweep_at_idx" (the first versions' "_expires_at_idx" is
// dropped by Migrate).
func WithTable(name string) Option {
	return func(c *config) { c.table = name }
}

// WithTransactions turns on transactional mode: each acquired claim opens a
// transaction that the handler writes its own effects in and that Complete
// commits together with the response. See the package documentation and README.md.
func WithTransactions() Option {
	return func(c *config) { c.transactional = true }
}

// WithLockTimeout sets how long, in transactional mode, a Claim waits for a
// concurrent transaction that holds the same key to commit or roll back,
// before it answers InFlight. Each waiting Claim holds a connection of the
// pool. It must be at least a millisecond; PostgreSQL takes at most 24 days
// (math.MaxInt32 milliseconds), and a longer one is that. When the session
// has a statement_timeout, the wait is at most half of it, and when the
// Claim's context has a deadline, at most half the time left to it, so that
// it ends as a lock timeout (InFlight) rather than a statement timeout or a
// deadline (a failure): behind the middleware, whose Claims have less than
// the lease, a duplicate is answered 409 whatever the lease. The default is
// 2 s; it is ignored in lease mode.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) { c.lockTimeout = d }
}

// WithIdleTimeout sets PostgreSQL's idle_in_transaction_session_timeout for
// the transactions of transactional mode: a transaction left idle that long
// (by a handler that hangs, or a caller that never completes or releases its
// claim) has its session ended by the server, which rolls it back and frees
// the key. Zero leaves the session's own setting (PostgreSQL's default is no
// timeout). A positive one is taken as at least 100 ms, since a
// shorter one would end transactions between the Store's own statements,
// and at most 24 days (math.MaxInt32 milliseconds, PostgreSQL's maximum).
// The default is 1 min; it is ignored in lease mode.
func WithIdleTimeout(d time.Duration) Option {
	return func(c *config) { c.idleTimeout = d }
}

// WithSweeper starts a background sweeper that calls [Store.Sweep] every interval,
// deleting expired records batch at a time, until [Store.Close]. An interval under
// a millisecond is taken as a millisecond. A batch below 1 means
// 1000. There is no sweeper by default: a team may prefer
// to sweep from one scheduled job rather than from every instance, and an
// expired record is taken over by the next Claim of its key anyway.
func WithSweeper(interval time.Duration, batch int) Option {
	return func(c *config) {
		c.sweepInterval = interval
		if interval > 0 {
			c.sweepInterval = max(interval, time.Millisecond)
		}
		if batch >= 1 {
			c.sweepBatch = batch
		}
	}
}

// WithLogger sets where the Store reports what it cannot return to a
// caller: failures of the background sweeper, of rollbacks done while
// closing, and its switch to unnamed statements when the server refuses a
// prepared one (see README.md, Poolers). The Store is silent by default.
//
// A nil logger is refused, as it is by the middleware's WithLogger: to log
// nothing, leave the option out or pass slog.New(slog.DiscardHandler).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.refuse("WithLogger needs a logger")
			return
		}
		c.logger = l
	}
}
