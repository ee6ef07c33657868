package mysqlstore

import "context"

// Sweep runs one sweep of s, for tests.
func Sweep(ctx context.Context, s Store, batch int) int64 { return s.(*store).sweep(ctx, batch) }

// ClaimStatement returns the claim statement on table, and its arguments
// in order, for tests of the server's answers.
func ClaimStatement(table string) (string, func(scope, key, fp []byte, lease, life, seen int64) []any) {
	q := newQueries("`" + table + "`")
	return q.claim, q.claimArgs
}
