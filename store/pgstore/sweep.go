package pgstore

import (
	"context"
	"fmt"
	"time"
)

// Sweep deletes the records that have expired, batch at a time (a batch below
// 1 means 1000), until a statement finds fewer than batch to
// delete, and returns how many it deleted. Each batch is one short statement
// and transaction, which locks only the rows it deletes and skips those that
// are locked, so a sweep of a million rows never makes a Claim wait for more
// than one batch, nor two sweepers wait for each other.
//
// Sweeping is housekeeping, not correctness: Claim treats an expired record
// as absent whether or not it was swept. Call Sweep from a scheduled job, or
// let WithSweeper call it.
func (s *Store) Sweep(ctx context.Context, batch int) (deleted int, err error) {
	if batch < 1 {
		batch = defaultSweepBatch
	}
	for {
		tag, err := s.pool.Exec(ctx, s.stmts().sweep, s.coldMode, batch)
		if err != nil {
			return deleted, fmt.Errorf("pgstore: sweep: %w", err)
		}
		n := int(tag.RowsAffected())
		deleted += n
		if n < batch {
			return deleted, nil
		}
	}
}

// sweepLoop is the background sweeper of WithSweeper; it ends when ctx does.
func (s *Store) sweepLoop(ctx context.Context, every time.Duration, batch int) {
	defer close(s.sweepDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.Sweep(ctx, batch)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("pgstore: sweep failed", "err", err, "deleted", n)
		case n > 0:
			s.log.Debug("pgstore: swept expired records", "deleted", n)
		}
	}
}
