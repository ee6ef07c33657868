package pgstore

// ReadSizeNext makes s's next Claim read the table's size, whenever the last
// one did.
func ReadSizeNext(s Store) { s.(*store).sizedAt.Store(0) }

// The defaults, for the tests that check them.
const (
	DefaultTable       = defaultTable
	DefaultLockTimeout = defaultLockTimeout
)

// ClaimInsertFirst and ClaimReadFirst fix how s's claims go: always an
// INSERT first (insertSQL) and a SELECT (readSQL) when it inserted nothing,
// or always the SELECT first and the INSERT when it found nothing. Call
// them before s is used, or between its calls.
func ClaimInsertFirst(s Store) { s.(*store).claimPath = claimPathInsertFirst }

// ClaimReadFirst: see ClaimInsertFirst.
func ClaimReadFirst(s Store) { s.(*store).claimPath = claimPathReadFirst }

// ClaimPaths names the ways a claim reads the key, for tests that run each.
var ClaimPaths = []struct {
	Name string
	Fix  func(Store)
}{{"insert first", ClaimInsertFirst}, {"read first", ClaimReadFirst}}
