package pgstore_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// backends records the PostgreSQL backend of each connection of a pool, to
// read the CPU they spend from /proc (the server runs on this machine).
type backends struct {
	mu   sync.Mutex
	pids []uint32
}

func (bs *backends) afterConnect(_ context.Context, c *pgx.Conn) error {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.pids = append(bs.pids, c.PgConn().PID())
	return nil
}

// cpu returns the CPU time the backends have spent, from the scheduler's
// nanosecond accounting, or false when /proc does not show them (a server
// on another machine).
func (bs *backends) cpu() (time.Duration, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var total time.Duration
	for _, pid := range bs.pids {
		b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/schedstat")
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b)) // time on the CPU (ns), time waiting for it, time slices
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		total += time.Duration(ns)
	}
	return total, true
}

const (
	// benchFill is how many records the table holds before a measurement:
	// more than 32 pages of them.
	benchFill = 5000
	// benchWarmUp is how many operations each goroutine runs before the
	// clock starts.
	benchWarmUp = 16
)

// BenchmarkBackendCPU measures the PostgreSQL backends' CPU per first
// execution (Claim of a new key, then Complete with a 1 KiB response) and
// per replay, in lease mode, beside the minimal statements that do a first
// execution's job: INSERT … ON CONFLICT DO NOTHING, then UPDATE. It reports
// backend-µs/op, read from /proc, and the WAL written per operation.
func BenchmarkBackendCPU(b *testing.B) {
	for _, bc := range []struct {
		name string
		run  benchOp
	}{
		{"first", runFirst},
		{"minimal", runMinimal},
		{"replay", runReplay},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := testContext(b)
			var bs backends
			pool := newPool(b, maxConns(benchGoroutines), func(c *pgxpool.Config) {
				c.MinConns = benchGoroutines // every backend known before the clock starts
				c.AfterConnect = bs.afterConnect
			})
			s, table := newStore(b, pool)
			id := engine.ID{Scope: "bench", Key: "replayed"}
			tok := acquire(b, ctx, s, id, "fp")
			require.NoError(b, s.Complete(ctx, id, tok, benchResponse(), time.Hour))
			prefix := uniqueName(b, "k")
			var n atomic.Int64
			// The steady state, not the warm-up: a table past the last plan
			// epoch (32 pages), and every connection's statements on their
			// generic plans (after five executions), before the clock
			// starts. Without it, the planning of each epoch's statements on
			// each connection, once, is a fifth of a first execution's CPU
			// in a run of 6000.
			insertRecords(b, ctx, pool, table, prefix+"fill", benchFill, time.Hour, time.Minute)
			_, err := pool.Exec(ctx, "ANALYZE "+pgx.Identifier{table}.Sanitize())
			require.NoError(b, err)
			var warm sync.WaitGroup
			for range benchGoroutines {
				warm.Go(func() {
					for range benchWarmUp {
						bc.run(b, ctx, s, pool, table, prefix+strconv.FormatInt(n.Add(1), 10))
					}
				})
			}
			warm.Wait()
			setParallelism(b)
			b.ReportAllocs()
			since := walPosition(b, ctx, pool)
			cpu0, ok := bs.cpu()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.run(b, ctx, s, pool, table, prefix+strconv.FormatInt(n.Add(1), 10))
				}
			})
			b.StopTimer()
			if cpu1, ok1 := bs.cpu(); ok && ok1 {
				b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/1e3/float64(b.N), "backend-µs/op")
			}
			reportWAL(b, ctx, pool, since)
			if bc.name != "replay" {
				reportHOT(b, ctx, pool, table, int64(b.N+benchGoroutines*benchWarmUp))
			}
		})
	}
}

// reportHOT reports the share of the table's updates that were HOT ones,
// which add no index entry, once the statistics count want updates (the
// backends send theirs within a second or so), or gives up after a while.
func reportHOT(b *testing.B, ctx context.Context, pool *pgxpool.Pool, table string, want int64) {
	var upd, hot int64
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			pgx.Identifier{table}.Sanitize()).Scan(&upd, &hot)
		require.NoError(b, err)
		if upd >= want || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	if upd > 0 {
		b.ReportMetric(100*float64(hot)/float64(upd), "HOT-%")
	}
}

// benchOp is one operation of BenchmarkBackendCPU, on a new key.
type benchOp func(b *testing.B, ctx context.Context, s engine.Store, pool *pgxpool.Pool, table, key string)

// runFirst is a first execution: Claim of a new key, then Complete with a
// 1 KiB response.
func runFirst(b *testing.B, ctx context.Context, s engine.Store, _ *pgxpool.Pool, _, key string) {
	id := engine.ID{Scope: "bench", Key: key}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || c.Status != engine.Acquired {
		b.Errorf("Claim = %v, %v", c.Status, err)
		return
	}
	if err := s.Complete(ctx, id, c.Token, benchResponse(), time.Hour); err != nil {
		b.Errorf("Complete: %v", err)
	}
}

// runMinimal does a first execution's job in the fewest statements:
// INSERT … ON CONFLICT DO NOTHING, then UPDATE.
func runMinimal(b *testing.B, ctx context.Context, _ engine.Store, pool *pgxpool.Pool, table, key string) {
	t := pgx.Identifier{table}.Sanitize()
	resp := benchResponse()
	var token int64
	err := pool.QueryRow(ctx, `INSERT INTO `+t+` (scope, key, fingerprint, state, token, lease_until, created_at, expires_at)
		VALUES ($1, $2, $3, 'in_flight', nextval('`+table+`_token_seq'), now() + interval '1 minute', now(), now() + interval '1 hour')
		ON CONFLICT (scope, key) DO NOTHING RETURNING token`, []byte("bench"), []byte(key), []byte("fp")).Scan(&token)
	if err != nil {
		b.Errorf("insert: %v", err)
		return
	}
	if _, err := pool.Exec(ctx, `UPDATE `+t+` SET state = 'completed', status = $4, headers = $5, body = $6
		WHERE scope = $1 AND key = $2 AND token = $3`, []byte("bench"), []byte(key), token,
		int32(resp.Status), []byte("h"), resp.Body); err != nil {
		b.Errorf("update: %v", err)
	}
}

// runReplay is a Claim of a completed key.
func runReplay(b *testing.B, ctx context.Context, s engine.Store, _ *pgxpool.Pool, _, _ string) {
	c, err := s.Claim(ctx, engine.ID{Scope: "bench", Key: "replayed"}, "fp", time.Minute, time.Hour)
	if err != nil || c.Status != engine.Completed {
		b.Errorf("Claim = %v, %v", c.Status, err)
	}
}
