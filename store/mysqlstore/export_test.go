package mysqlstore

import "context"

// Sweep runs one sweep of s, for tests.
func Sweep(ctx context.Context, s Store, batch int) int64 { return s.(*store).sweep(ctx, batch) }

// The claim statement and the clock, for tests of the server's answers.
const (
	ClaimSQL = claimSQL
	NowUS    = nowUS
)
