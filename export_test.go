package idempotency

// WithRand replaces the source of randomness of the backoff, so that tests
// can predict the waits. rnd(n) must return a number in [0, n).
func WithRand(rnd func(n int64) int64) Option {
	return func(c *config) { c.rand = rnd }
}

// Available returns the tokens left in b, for the tests of package
// idempotency_test.
func Available(b *Budget) int { return b.left() }

// Capacity returns the capacity of b.
func Capacity(b *Budget) int { return int(b.capacity) }
