package idempotency

// WithRand replaces the source of randomness of the backoff, so that tests
// can predict the waits. rnd(n) must return a number in [0, n).
func WithRand(rnd func(n int64) int64) Option {
	return func(c *config) { c.rand = rnd }
}
