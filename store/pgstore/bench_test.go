package pgstore_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/pgstore"
)

// The benchmarks run about 32 goroutines (SetParallelism over GOMAXPROCS),
// the concurrency of the HTTP benchmark, on a pool with a connection
// for each.
const benchGoroutines = 32

var benchModes = []struct {
	name string
	opts []pgstore.Option
}{
	{"lease", nil},
	{"tx", []pgstore.Option{pgstore.WithTransactions()}},
}

func benchResponse() *engine.Response {
	return &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:   bytes.Repeat([]byte("x"), 1024),
	}
}

func setParallelism(b *testing.B) {
	b.SetParallelism(max(1, benchGoroutines/runtime.GOMAXPROCS(0)))
}

// walPosition returns the cluster's WAL position, to measure what a benchmark
// wrote (with whatever else the server wrote meanwhile).
func walPosition(b *testing.B, ctx context.Context, pool *pgxpool.Pool) string {
	var lsn string
	require.NoError(b, pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn))
	return lsn
}

func reportWAL(b *testing.B, ctx context.Context, pool *pgxpool.Pool, since string) {
	var n float64
	require.NoError(b, pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", since).Scan(&n))
	b.ReportMetric(n/float64(b.N), "WAL-B/op")
}

// BenchmarkClaimComplete measures first executions: Claim of a new key, then
// Complete with a 1 KiB response.
func BenchmarkClaimComplete(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.name, func(b *testing.B) {
			ctx := testContext(b)
			pool := newPool(b, maxConns(benchGoroutines))
			s, _ := newStore(b, pool, mode.opts...)
			resp := benchResponse()
			prefix := uniqueName(b, "k")
			var n atomic.Int64
			setParallelism(b)
			b.ReportAllocs()
			since := walPosition(b, ctx, pool)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := engine.ID{Scope: "bench", Key: prefix + strconv.FormatInt(n.Add(1), 10)}
					c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
					if err != nil || c.Status != engine.Acquired {
						b.Errorf("Claim = %v, %v", c.Status, err)
						return
					}
					if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
						b.Errorf("Complete: %v", err)
						return
					}
				}
			})
			b.StopTimer()
			reportWAL(b, ctx, pool, since)
		})
	}
}

// BenchmarkReplay measures Claim of a completed key: a read of one row, no
// write.
func BenchmarkReplay(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.name, func(b *testing.B) {
			ctx := testContext(b)
			pool := newPool(b, maxConns(benchGoroutines))
			s, _ := newStore(b, pool, mode.opts...)
			id := scopeID("replayed")
			tok := acquire(b, ctx, s, id, "fp")
			require.NoError(b, s.Complete(ctx, id, tok, benchResponse(), time.Hour))
			setParallelism(b)
			b.ReportAllocs()
			since := walPosition(b, ctx, pool)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
					if err != nil || c.Status != engine.Completed {
						b.Errorf("Claim = %v, %v", c.Status, err)
						return
					}
				}
			})
			b.StopTimer()
			reportWAL(b, ctx, pool, since)
		})
	}
}

var sweepBench = flag.Bool("pgstore.sweepbench", false,
	"measure Claim latency while a million expired records are swept (about a minute)")

// TestSweepUnderLoad is a measurement, not a test: run it with
// -pgstore.sweepbench. It fills a table with a million expired records, then
// has 8 goroutines Claim and Complete new keys, first alone and then while
// Sweep deletes the expired records, and logs the latency percentiles.
func TestSweepUnderLoad(t *testing.T) {
	if !*sweepBench {
		t.Skip("a measurement: run with -pgstore.sweepbench")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pool := newPool(t, maxConns(12))
	s, table := newStore(t, pool)
	const workers = 8

	for _, batch := range []int{1000, 10000} {
		start := time.Now()
		insertRecords(t, ctx, pool, table, fmt.Sprintf("expired-%d-", batch), 1_000_000, -time.Second, -time.Second)
		_, err := pool.Exec(ctx, "ANALYZE "+pgx.Identifier{table}.Sanitize())
		require.NoError(t, err)
		t.Logf("inserted 1,000,000 expired records in %v", time.Since(start).Round(time.Millisecond))
		// Write the inserted pages out now, so that the measurements below
		// compare the sweep with its absence, not with the insert's
		// write-back. (It needs a superuser or pg_checkpoint; without it,
		// the numbers are noisier.)
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Logf("CHECKPOINT: %v", err)
		}

		alone := claimLoad(t, ctx, s, workers, func() { time.Sleep(5 * time.Second) })
		var (
			deleted int
			took    time.Duration
		)
		during := claimLoad(t, ctx, s, workers, func() {
			start := time.Now()
			deleted, err = s.Sweep(ctx, batch)
			took = time.Since(start)
		})
		require.NoError(t, err)
		after := claimLoad(t, ctx, s, workers, func() { time.Sleep(5 * time.Second) })
		t.Logf("sweep, batch %d: deleted %d in %v (%.0f rows/s)", batch, deleted, took.Round(time.Millisecond), float64(deleted)/took.Seconds())
		t.Logf("  5 s before the sweep: %s", alone)
		t.Logf("  during the sweep:     %s", during)
		t.Logf("  5 s after the sweep:  %s", after)
	}
}

// latencies summarises a claim load.
type latencies struct {
	claims, completes []time.Duration
}

func (l latencies) String() string {
	return fmt.Sprintf("%d claim+complete; claim p50 %v p99 %v max %v; complete p50 %v p99 %v",
		len(l.claims), pct(l.claims, 50), pct(l.claims, 99), pct(l.claims, 100),
		pct(l.completes, 50), pct(l.completes, 99))
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := min(len(d)-1, (len(d)*p)/100)
	return d[i].Round(10 * time.Microsecond)
}

// claimLoad runs workers goroutines that Claim and Complete new keys until
// during returns, and returns their latencies, sorted.
func claimLoad(t *testing.T, ctx context.Context, s pgstore.Store, workers int, during func()) latencies {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		all   latencies
		stop  = make(chan struct{})
		resp  = benchResponse()
		keyNo atomic.Int64
	)
	prefix := uniqueName(t, "load")
	for range workers {
		wg.Go(func() {
			var mine latencies
			for {
				select {
				case <-stop:
					mu.Lock()
					all.claims = append(all.claims, mine.claims...)
					all.completes = append(all.completes, mine.completes...)
					mu.Unlock()
					return
				default:
				}
				id := engine.ID{Scope: "load", Key: prefix + strconv.FormatInt(keyNo.Add(1), 10)}
				start := time.Now()
				c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
				mid := time.Now()
				if err != nil || c.Status != engine.Acquired {
					t.Errorf("Claim = %v, %v", c.Status, err)
					continue
				}
				if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
					t.Errorf("Complete: %v", err)
				}
				mine.claims = append(mine.claims, mid.Sub(start))
				mine.completes = append(mine.completes, time.Since(mid))
			}
		})
	}
	during()
	close(stop)
	wg.Wait()
	slices.Sort(all.claims)
	slices.Sort(all.completes)
	return all
}

// BenchmarkExecModes measures replays in lease mode with the pool set to
// each of pgx's ways of sending a statement. The Store keeps the pool's mode
// except pgx's default, QueryExecModeCacheStatement, for which it sends
// unnamed statements (QueryExecModeCacheDescribe): see execMode.
func BenchmarkExecModes(b *testing.B) {
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	} {
		b.Run(mode.String(), func(b *testing.B) {
			ctx := testContext(b)
			pool := newPool(b, maxConns(benchGoroutines), func(c *pgxpool.Config) {
				c.ConnConfig.DefaultQueryExecMode = mode
			})
			s, _ := newStore(b, pool)
			id := scopeID("replayed")
			tok := acquire(b, ctx, s, id, "fp")
			require.NoError(b, s.Complete(ctx, id, tok, benchResponse(), time.Hour))
			setParallelism(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
					if err != nil || c.Status != engine.Completed {
						b.Errorf("Claim = %v, %v", c.Status, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkStepCost measures a first execution through once.Do whose
// function inserts a row: plainly, in a step of package step (the INSERT,
// then SaveStep), and in RunStep (one transaction: BEGIN, the INSERT, the
// step's UPDATE, COMMIT), in lease mode.
func BenchmarkStepCost(b *testing.B) {
	for _, bc := range []struct {
		name string
		run  func(ctx context.Context, s pgstore.Store, pool *pgxpool.Pool, orders, key string) (int64, error)
	}{
		{"plain", func(ctx context.Context, _ pgstore.Store, pool *pgxpool.Pool, orders, key string) (int64, error) {
			return insertOrderOn(ctx, pool, orders, key)
		}},
		{"step.Run", func(ctx context.Context, _ pgstore.Store, pool *pgxpool.Pool, orders, key string) (int64, error) {
			return step.Run(ctx, "order", 100, func(ctx context.Context) (int64, error) {
				return insertOrderOn(ctx, pool, orders, key)
			})
		}},
		{"RunStep", func(ctx context.Context, s pgstore.Store, _ *pgxpool.Pool, orders, key string) (int64, error) {
			return pgstore.RunStep(ctx, s, "order", 100, func(ctx context.Context, tx pgx.Tx) (int64, error) {
				return insertOrder(ctx, tx, orders, key)
			})
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := testContext(b)
			pool := newPool(b, maxConns(benchGoroutines))
			s, _ := newStore(b, pool)
			orders := newOrders(b, pool)
			r, err := once.New(s, once.WithConfig(engine.Config{Logger: quiet}))
			require.NoError(b, err)
			defer r.Shutdown(ctx)
			prefix := uniqueName(b, "k")
			var n atomic.Int64
			setParallelism(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := prefix + strconv.FormatInt(n.Add(1), 10)
					_, err := once.Do(ctx, r, engine.ID{Scope: "bench", Key: key}, "input", func(ctx context.Context) (int64, error) {
						return bc.run(ctx, s, pool, orders, key)
					})
					if err != nil {
						b.Errorf("Do: %v", err)
						return
					}
				}
			})
		})
	}
}

// insertOrderOn is insertOrder outside a transaction.
func insertOrderOn(ctx context.Context, pool *pgxpool.Pool, orders, key string) (int64, error) {
	var id int64
	err := pool.QueryRow(ctx, "INSERT INTO "+orders+" (idem_key, amount) VALUES ($1, 100) RETURNING id", key).Scan(&id)
	return id, err
}

// BenchmarkStepWrites measures, one at a time, a SaveStep of a step of
// 300 bytes (replacing one of three) and a Complete with a 300-byte body:
// each one UPDATE of the record's row.
func BenchmarkStepWrites(b *testing.B) {
	ctx := testContext(b)
	pool := newPool(b)
	s, _ := newStore(b, pool)
	payload := bytes.Repeat([]byte("s"), 300)
	b.Run("SaveStep", func(b *testing.B) {
		id := scopeID(uniqueName(b, "save"))
		tok := acquire(b, ctx, s, id, "fp")
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			st := engine.Step{Name: "s" + strconv.Itoa(i%3), Fingerprint: "fp", Done: true, Result: payload}
			if err := s.SaveStep(ctx, id, tok, st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Complete", func(b *testing.B) {
		prefix := uniqueName(b, "complete")
		resp := &engine.Response{Status: http.StatusCreated, Body: payload}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			id := scopeID(prefix + strconv.Itoa(i))
			tok := acquire(b, ctx, s, id, "fp")
			b.StartTimer()
			if err := s.Complete(ctx, id, tok, resp, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}
