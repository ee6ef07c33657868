package sqlitestore

// Option configures Open.
type Option func(*config)

type config struct {
	fullSync      bool
	transactional bool
}

// WithFullSync sets synchronous=FULL: every commit waits for the WAL to
// reach the disk (an fsync), so that a record committed survives a power
// loss or an operating system crash, at the cost of an fsync per Claim and
// per Complete. Without it (synchronous=NORMAL, the default) a commit
// survives the process's crash or kill, but the last ones before a power
// loss may be lost (the file stays consistent): see the package
// documentation.
func WithFullSync() Option { return func(c *config) { c.fullSync = true } }

// WithTransactions turns transactional mode on: the claim, the handler's
// own writes in the same file (TxFromContext) and the stored response
// commit in one transaction, or not at all. See the package documentation.
func WithTransactions() Option { return func(c *config) { c.transactional = true } }
