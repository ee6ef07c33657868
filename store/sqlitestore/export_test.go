package sqlitestore

import "context"

// Sweep runs one sweep of s, for tests.
func Sweep(ctx context.Context, s Store, batch int) int64 { return s.(*store).sweep(ctx, batch) }

// FirstSwept waits for the end of the sweep that Open starts.
func FirstSwept(s Store) { <-s.(*store).firstSwept }
