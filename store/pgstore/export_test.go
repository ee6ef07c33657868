package pgstore

// ReadSizeNext makes s's next Claim read the table's size, whenever the last
// one did.
func ReadSizeNext(s Store) { s.(*store).sizedAt.Store(0) }

// The defaults, for the tests that check them.
const (
	DefaultTable       = defaultTable
	DefaultLockTimeout = defaultLockTimeout
)

// ClaimOneStatement and ClaimReadFirst fix how s's claims read the key:
// always in the statement that inserts (claimSQL), or always in a SELECT
// of their own (readSQL). Call them before s is used.
func ClaimOneStatement(s Store) { s.(*store).claimPath = claimPathOneStatement }

// ClaimReadFirst: see ClaimOneStatement.
func ClaimReadFirst(s Store) { s.(*store).claimPath = claimPathReadFirst }

// ClaimPaths names the ways a claim reads the key, for tests that run each.
var ClaimPaths = []struct {
	Name string
	Fix  func(Store)
}{{"one statement", ClaimOneStatement}, {"read first", ClaimReadFirst}}
