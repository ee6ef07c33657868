package pgstore_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
)

// ratioRound is how many operations of each kind a round of
// BenchmarkBackendCPURatio runs, shared among its goroutines.
const ratioRound = 320

// BenchmarkBackendCPURatio measures what BenchmarkBackendCPU does, but in
// alternating rounds, so that the load of a shared machine, which drifts
// between two sub-benchmarks run one after the other, weighs on all alike:
// b.N is the number of rounds' operations of each kind. The kinds: a first
// execution; the minimal statements on the store's table; the minimal
// statements on a plain table of their own (scope, key, fingerprint, token,
// expiry, status, body; the primary key and no other index); a replay; and
// a SELECT of the replayed row's columns. It reports each one's backend CPU
// per operation and the ratios first/minimal, first/plain (the minimal on
// the plain table) and replay/select.
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
	id := engine.ID{Scope: "bench", Key: "replayed"}
	tok := acquire(b, ctx, s, id, "fp")
	require.NoError(b, s.Complete(ctx, id, tok, benchResponse(), time.Hour))
	plain := createPlainTable(b, ctx, pool)
	runPlain := func(b *testing.B, ctx context.Context, _ engine.Store, pool *pgxpool.Pool, _, key string) {
		runMinimalPlain(b, ctx, pool, plain, key)
	}
	kinds := []benchOp{runFirst, runMinimal, runPlain, runReplay, runSelect}
	for _, op := range kinds {
		ops(op, benchGoroutines*benchWarmUp)
	}
	var spent [5]time.Duration
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
	for i, name := range []string{"first", "minimal", "plain", "replay", "select"} {
		b.ReportMetric(perOp(spent[i]), name+"-backend-µs/op")
	}
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }
	b.ReportMetric(ratio(spent[0], spent[1]), "first/minimal")
	b.ReportMetric(ratio(spent[0], spent[2]), "first/plain")
	b.ReportMetric(ratio(spent[3], spent[4]), "replay/select")
}

// createPlainTable creates a table with only what the minimal statements
// need: scope, key, fingerprint, token, expiry, status, body, the primary
// key (scope, key) and no other index. It is dropped when b ends.
func createPlainTable(b *testing.B, ctx context.Context, pool *pgxpool.Pool) string {
	table := uniqueName(b, "plain")
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{table}.Sanitize()+` (
		scope bytea NOT NULL, key bytea NOT NULL, fingerprint bytea NOT NULL, token bigint NOT NULL,
		expires_at timestamptz NOT NULL, status integer, body bytea, PRIMARY KEY (scope, key))`)
	require.NoError(b, err)
	dropOnCleanup(b, pool, table)
	return table
}

// runMinimalPlain is runMinimal on a table of createPlainTable's: INSERT …
// ON CONFLICT DO NOTHING of the key with a token, then UPDATE of the
// response where the token is that one.
func runMinimalPlain(b *testing.B, ctx context.Context, pool *pgxpool.Pool, table, key string) {
	t := pgx.Identifier{table}.Sanitize()
	resp := benchResponse()
	var token int64
	err := pool.QueryRow(ctx, `INSERT INTO `+t+` (scope, key, fingerprint, token, expires_at)
		VALUES ($1, $2, $3, $4, now() + interval '1 hour')
		ON CONFLICT (scope, key) DO NOTHING RETURNING token`, []byte("bench"), []byte(key), []byte("fp"), time.Now().UnixMicro()).Scan(&token)
	if err != nil {
		b.Errorf("insert: %v", err)
		return
	}
	if _, err := pool.Exec(ctx, `UPDATE `+t+` SET status = $4, body = $5
		WHERE scope = $1 AND key = $2 AND token = $3`, []byte("bench"), []byte(key), token,
		int32(resp.Status), resp.Body); err != nil {
		b.Errorf("update: %v", err)
	}
}

// runSelect reads the columns of the replayed row that a replay returns, in
// a plain SELECT.
func runSelect(b *testing.B, ctx context.Context, _ engine.Store, pool *pgxpool.Pool, table, _ string) {
	var (
		state             string
		fp, headers, body []byte
		status            int32
		omitted           bool
	)
	err := pool.QueryRow(ctx, `SELECT state, fingerprint, coalesce(status, 0), headers, body, body_omitted
		FROM `+pgx.Identifier{table}.Sanitize()+` WHERE scope = $1 AND key = $2`,
		[]byte("bench"), []byte("replayed")).Scan(&state, &fp, &status, &headers, &body, &omitted)
	if err != nil || state != "completed" {
		b.Errorf("SELECT = %q, %v; want the completed record", state, err)
	}
}
