package pgstore

import (
	"context"
	"fmt"
	"time"
)

// Sweep implements Store.
func (s *store) Sweep(ctx context.Context, batch int) (deleted int, err error) {
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
func (s *store) sweepLoop(ctx context.Context, every time.Duration, batch int) {
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
