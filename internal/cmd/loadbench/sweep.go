package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/store/memstore"
)

// sweeps measures first executions, with the latency of each Claim, before,
// during and after the removal of -sweep expired records: by pgstore's Sweep,
// by memstore's background sweep, by Redis's own expiry.
func (b *bench) sweeps(ctx context.Context, rep *benchreport.Report) error {
	fmt.Fprintf(b.out, "\n== removal of %d expired records\n", b.cfg.sweep)
	for _, st := range b.stores {
		var (
			s   benchreport.Sweep
			err error
		)
		switch sb := st.storeBench.(type) {
		case *postgresBench:
			s, err = b.sweepPostgres(ctx, st, sb)
		case *memoryBench:
			s, err = b.expireMemory(ctx, st)
		case *redisBench:
			if sb.own == nil {
				fmt.Fprintln(b.out, "redis: skipped: the expiry is watched on a server of the run's own")
				continue
			}
			s, err = b.expireRedis(ctx, st, sb)
		}
		if err != nil {
			return fmt.Errorf("loadbench: %s: removal of expired records: %w", st.name(), err)
		}
		rep.Sweeps = append(rep.Sweeps, s)
		printSweep(b.out, s)
	}
	return nil
}

// window runs first executions on st for d, or, when d is 0, until until
// returns, and measures them.
func (b *bench) window(name string, st *storeTarget, ts *timedStore, d time.Duration, until func() error) (benchreport.Window, error) {
	ts.claims.take()
	var (
		res result
		err error
	)
	if d > 0 {
		res, err = b.gen.run(job{URL: st.url, Concurrency: b.cfg.sweepC, Seconds: d.Seconds()})
	} else {
		var stop func() (result, error)
		if stop, err = b.gen.start(st.url, b.cfg.sweepC); err != nil {
			return benchreport.Window{}, err
		}
		uerr := until()
		res, err = stop()
		err = errors.Join(uerr, err)
	}
	if err != nil {
		return benchreport.Window{}, err
	}
	lat := ts.claims.take()
	return benchreport.Window{
		Name:      name,
		Seconds:   res.Seconds,
		Claims:    lat.n,
		ClaimP50:  micros(lat.percentile(50)),
		ClaimP99:  micros(lat.percentile(99)),
		ClaimMax:  micros(lat.max),
		PerSecond: float64(res.ok()) / res.Seconds,
		P50:       micros(res.P50),
		P99:       micros(res.P99),
	}, nil
}

// sweepPostgres fills the table with expired records, then runs load before,
// during and after a Sweep.
func (b *bench) sweepPostgres(ctx context.Context, st *storeTarget, p *postgresBench) (benchreport.Sweep, error) {
	n := b.cfg.sweep
	if err := p.deletePrefilled(ctx); err != nil {
		return benchreport.Sweep{}, err
	}
	start := time.Now()
	past := "statement_timestamp() - interval '1 second'"
	if err := p.copyRecords(ctx, 1, n, map[string]string{"expires_at": past, "lease_until": past, "sweep_at": past}); err != nil {
		return benchreport.Sweep{}, err
	}
	fmt.Fprintf(b.out, "postgres: inserted %d expired records in %v\n", n, time.Since(start).Round(time.Millisecond))
	if _, err := p.admin.Exec(ctx, "VACUUM ANALYZE "+p.ident()); err != nil {
		return benchreport.Sweep{}, err
	}
	// Write the inserted pages out now, so that the sweep is not compared
	// with the insert's write-back (needs a superuser or pg_checkpoint).
	if _, err := p.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(b.out, "postgres: CHECKPOINT: %v\n", err)
	}
	store, ts := timed(p.store)
	h, err := newMiddleware(store)
	if err != nil {
		return benchreport.Sweep{}, err
	}
	st.swap.set(h)
	runtime.GC()
	s := benchreport.Sweep{
		Store: benchreport.Postgres, Expired: n, Concurrency: b.cfg.sweepC,
		How: "Sweep, batch " + strconv.Itoa(b.cfg.sweepBatch),
	}
	before, err := b.window("before", st, ts, b.cfg.duration, nil)
	if err != nil {
		return s, err
	}
	var took time.Duration
	during, err := b.window("during", st, ts, 0, func() error {
		start := time.Now()
		deleted, err := p.store.Sweep(ctx, b.cfg.sweepBatch)
		took, s.Removed = time.Since(start), deleted
		return err
	})
	if err != nil {
		return s, err
	}
	after, err := b.window("after", st, ts, b.cfg.duration, nil)
	if err != nil {
		return s, err
	}
	s.Seconds = took.Seconds()
	s.RowsPerSecond = float64(s.Removed) / took.Seconds()
	s.Windows = []benchreport.Window{before, during, after}
	return s, nil
}

// watchRemoval polls left, the expired records still held, from from
// until at most 1% of them are, until none has gone for stall, or for at
// most limit. It returns when the first went, when the last of those went,
// and how many went.
func watchRemoval(ctx context.Context, from int64, every, stall, limit time.Duration, left func() (int64, error)) (first, last time.Time, removed int64, err error) {
	t := time.NewTicker(every)
	defer t.Stop()
	prev, moved := from, time.Now()
	end := moved.Add(limit)
	for {
		n, err := left()
		if err != nil {
			return first, last, from - prev, err
		}
		now := time.Now()
		if n < prev {
			if first.IsZero() {
				first = now
			}
			prev, last, moved = n, now, now
		}
		if prev <= from/100 || now.Sub(moved) > stall || now.After(end) {
			return first, last, from - prev, nil
		}
		select {
		case <-ctx.Done():
			return first, last, from - prev, ctx.Err()
		case <-t.C:
		}
	}
}

// expireMemory fills a memstore with records that all expire at one moment,
// just before its first background sweep, and runs load before that moment,
// until the sweep has removed them, and after.
func (b *bench) expireMemory(ctx context.Context, st *storeTarget) (benchreport.Sweep, error) {
	n := b.cfg.sweep
	d := b.cfg.duration
	// Time enough to fill the store, then a window before the expiry.
	ahead := d + time.Second + time.Duration(n)*20*time.Microsecond
	at := time.Now().Add(ahead)
	// The first sweep comes just after the records expire, the second not
	// before the run ends.
	s, err := newMemstore(memstore.WithSweepInterval(ahead + 20*time.Millisecond))
	if err != nil {
		return benchreport.Sweep{}, err
	}
	defer s.Close()
	if err := prefillMemoryUntil(ctx, s, n, func() time.Duration { return time.Until(at) }); err != nil {
		return benchreport.Sweep{}, err
	}
	store, ts := timed(s)
	h, err := newMiddleware(store)
	if err != nil {
		return benchreport.Sweep{}, err
	}
	st.swap.set(h)
	runtime.GC()
	left := time.Until(at)
	if left < d/2 {
		return benchreport.Sweep{}, fmt.Errorf("filling took too long: %v left before the expiry", left)
	}
	sw := benchreport.Sweep{Store: benchreport.Memory, Expired: n, Concurrency: b.cfg.sweepC, How: "background sweep"}
	before, err := b.window("before", st, ts, left, nil)
	if err != nil {
		return sw, err
	}
	var (
		first, last time.Time
		removed     int64
	)
	during, err := b.window("during", st, ts, 0, func() error {
		var err error
		first, last, removed, err = watchRemoval(ctx, int64(n), time.Millisecond, b.cfg.sweepStall, b.cfg.sweepMax, func() (int64, error) {
			return int64(s.Len()) - ts.acquired.Load(), nil
		})
		return err
	})
	if err != nil {
		return sw, err
	}
	after, err := b.window("after", st, ts, d, nil)
	if err != nil {
		return sw, err
	}
	sw.Removed = int(removed)
	sw.Seconds = last.Sub(first).Seconds()
	sw.RowsPerSecond = float64(removed) / max(sw.Seconds, 1e-6)
	sw.Windows = []benchreport.Window{before, during, after}
	return sw, nil
}

// expireScript sets the expiry of the records prefill-(from) to
// prefill-(to), whose keys are ARGV[1] followed by the number, to the
// Unix time in milliseconds ARGV[4]. It names keys it is not given, which a
// Cluster would refuse: it runs on the server the run started.
const expireScript = `for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  redis.call('PEXPIREAT', ARGV[1] .. i, ARGV[4])
end
return 1`

// expireRedis fills the run's own Redis with records, then has them all
// expire at one moment, and runs load before that moment, until Redis has
// removed them, and after.
func (b *bench) expireRedis(ctx context.Context, st *storeTarget, r *redisBench) (benchreport.Sweep, error) {
	n := b.cfg.sweep
	d := b.cfg.duration
	if _, err := r.fill(ctx, 0); err != nil {
		return benchreport.Sweep{}, err
	}
	start := time.Now()
	if err := r.copyRecords(ctx, 1, n, 0); err != nil {
		return benchreport.Sweep{}, err
	}
	fmt.Fprintf(b.out, "redis: stored %d records in %v\n", n, time.Since(start).Round(time.Millisecond))
	base, err := r.admin.DBSize(ctx).Result()
	if err != nil {
		return benchreport.Sweep{}, err
	}
	base -= int64(n)
	at := time.Now().Add(d + 3*time.Second)
	const chunk = 100_000
	for lo := 1; lo <= n; lo += chunk {
		err := r.admin.Eval(ctx, expireScript, nil, r.recordKey("prefill-"), lo, min(n, lo+chunk-1), at.UnixMilli()).Err()
		if err != nil {
			return benchreport.Sweep{}, err
		}
	}
	store, ts := timed(r.store)
	h, err := newMiddleware(store)
	if err != nil {
		return benchreport.Sweep{}, err
	}
	st.swap.set(h)
	runtime.GC()
	left := time.Until(at)
	if left < d/2 {
		return benchreport.Sweep{}, fmt.Errorf("setting the expiry took too long: %v left before it", left)
	}
	sw := benchreport.Sweep{Store: benchreport.Redis, Expired: n, Concurrency: b.cfg.sweepC, How: "Redis's expiry"}
	before, err := b.window("before", st, ts, left, nil)
	if err != nil {
		return sw, err
	}
	var (
		first, last time.Time
		removed     int64
	)
	during, err := b.window("during", st, ts, 0, func() error {
		var err error
		first, last, removed, err = watchRemoval(ctx, int64(n), 5*time.Millisecond, b.cfg.sweepStall, b.cfg.sweepMax, func() (int64, error) {
			size, err := r.admin.DBSize(ctx).Result()
			return size - base - ts.acquired.Load(), err
		})
		return err
	})
	if err != nil {
		return sw, err
	}
	after, err := b.window("after", st, ts, d, nil)
	if err != nil {
		return sw, err
	}
	r.prefilled = 0
	sw.Removed = int(removed)
	sw.Seconds = last.Sub(first).Seconds()
	sw.RowsPerSecond = float64(removed) / max(sw.Seconds, 1e-6)
	sw.Windows = []benchreport.Window{before, during, after}
	return sw, nil
}
