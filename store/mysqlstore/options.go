package mysqlstore

// Option configures New.
type Option func(*config)

type config struct {
	table         string
	transactional bool
}

// WithTable names the table of the records: letters, digits and
// underscores, up to 64 of them, optionally after a database's name and a
// dot. New refuses any other name.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithTransactions turns transactional mode on: the claim, the handler's
// own writes in the same database (TxFromContext) and the stored response
// commit in one transaction, or not at all. See the package documentation.
func WithTransactions() Option { return func(c *config) { c.transactional = true } }
