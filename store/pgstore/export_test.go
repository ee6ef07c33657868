package pgstore

// ReadSizeNext makes s's next Claim read the table's size, whenever the last
// one did.
func ReadSizeNext(s Store) { s.(*store).sizedAt.Store(0) }

// The defaults, for the tests that check them.
const (
	DefaultTable       = defaultTable
	DefaultLockTimeout = defaultLockTimeout
)
