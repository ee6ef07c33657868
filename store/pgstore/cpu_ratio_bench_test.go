package pgstore_test

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// ratioRound is how many operations of each kind a round of
// BenchmarkBackendCPURatio runs, shared among its goroutines.
const ratioRound = 320

// BenchmarkBackendCPURatio measures what BenchmarkBackendCPU does for first
// executions and the minimal statements, but in alternating rounds on one
// table, so that the load of a shared machine, which drifts between two
// sub-benchmarks run one after the other, weighs on both alike: b.N is the
// number of pairs, one first execution and one run of the minimal
// statements. It reports each one's backend CPU per operation and their
// ratio, first/minimal.
func BenchmarkBackendCPURatio(b *testing.B) {
	ctx := testContext(b)
	var bs backends
	pool := newPool(b, maxConns(benchGoroutines), func(c *pgxpool.Config) {
		c.MinConns = benchGoroutines
		c.AfterConnect = bs.afterConnect
	})
	s, table := newStore(b, pool)
	prefix := uniqueName(b, "k")
	var n atomic.Int64
	insertRecords(b, ctx, pool, table, prefix+"fill", benchFill, time.Hour, time.Minute)
	_, err := pool.Exec(ctx, "ANALYZE "+pgx.Identifier{table}.Sanitize())
	require.NoError(b, err)
	// ops runs count operations of op on benchGoroutines goroutines.
	ops := func(op benchOp, count int) {
		var left atomic.Int64
		left.Store(int64(count))
		var wg sync.WaitGroup
		for range benchGoroutines {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					op(b, ctx, s, pool, table, prefix+strconv.FormatInt(n.Add(1), 10))
				}
			})
		}
		wg.Wait()
	}
	kinds := []benchOp{runFirst, runMinimal}
	for _, op := range kinds {
		ops(op, benchGoroutines*benchWarmUp)
	}
	var spent [2]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += ratioRound {
		count := min(ratioRound, b.N-done)
		for i, op := range kinds {
			cpu0, ok0 := bs.cpu()
			ops(op, count)
			cpu1, ok1 := bs.cpu()
			if !ok0 || !ok1 {
				b.Skip("the backends' CPU is not readable from /proc: the server runs elsewhere")
			}
			spent[i] += cpu1 - cpu0
		}
	}
	b.StopTimer()
	perOp := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
	b.ReportMetric(perOp(spent[0]), "first-backend-µs/op")
	b.ReportMetric(perOp(spent[1]), "minimal-backend-µs/op")
	if spent[1] > 0 {
		b.ReportMetric(float64(spent[0])/float64(spent[1]), "first/minimal")
	}
}
