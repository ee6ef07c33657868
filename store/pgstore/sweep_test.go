package pgstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
)

// deleteTracer records the rows deleted by each DELETE statement that a pool
// runs.
type deleteTracer struct {
	mu      sync.Mutex
	deleted []int64
}

type traceKey struct{}

func (d *deleteTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceKey{}, strings.HasPrefix(data.SQL, "DELETE"))
}

func (d *deleteTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if isDelete, _ := ctx.Value(traceKey{}).(bool); isDelete && data.Err == nil {
		d.mu.Lock()
		d.deleted = append(d.deleted, data.CommandTag.RowsAffected())
		d.mu.Unlock()
	}
}

func (d *deleteTracer) take() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.deleted
	d.deleted = nil
	return r
}

// insertRecords inserts n records straight into the table, keys prefix1 to
// prefixN, that expire after expiresIn (negative: expired already) and whose
// leases end after leaseIn.
func insertRecords(t testing.TB, ctx context.Context, pool *pgxpool.Pool, table, prefix string, n int, expiresIn, leaseIn time.Duration) {
	t.Helper()
	_, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+`
		(scope, key, fingerprint, state, token, lease_until, created_at, expires_at)
		SELECT 'pgstore-test', convert_to($1 || i, 'UTF8'), 'fp', 'in_flight', nextval($2::regclass),
			now() + $4::bigint * interval '1 microsecond', now(), now() + $3::bigint * interval '1 microsecond'
		FROM generate_series(1, $5::int) AS i`,
		prefix, pgx.Identifier{table + "_token_seq"}.Sanitize(), expiresIn.Microseconds(), leaseIn.Microseconds(), n)
	require.NoError(t, err)
}

func TestSweep(t *testing.T) {
	ctx := testContext(t)
	tracer := &deleteTracer{}
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	s, table := newStore(t, pool)

	insertRecords(t, ctx, pool, table, "expired", 25, -time.Second, -time.Second)
	// Live records, one of them with a lease that ended: not expired.
	insertRecords(t, ctx, pool, table, "live", 9, time.Hour, time.Minute)
	insertRecords(t, ctx, pool, table, "abandoned", 1, time.Hour, -time.Second)
	tracer.take()

	n, err := s.Sweep(ctx, 7)
	require.NoError(t, err)
	assert.Equal(t, 25, n, "Sweep deleted")
	assert.Equal(t, []int64{7, 7, 7, 4}, tracer.take(), "rows deleted by each statement")
	assert.Equal(t, 10, count(t, ctx, pool, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()), "records left")

	c, err := s.Claim(ctx, scopeID("live1"), "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.InFlight, c.Status, "a live record after the sweep")

	n, err = s.Sweep(ctx, 0)
	require.NoError(t, err)
	assert.Zero(t, n, "second Sweep deleted")
}

// A sweep skips the expired rows that another transaction holds, rather
// than wait for it.
func TestSweepSkipsLockedRows(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	insertRecords(t, ctx, pool, table, "expired", 10, -time.Second, -time.Second)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{table}.Sanitize()+" WHERE key = 'expired1' FOR UPDATE")
	require.NoError(t, err)

	sweepCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := s.Sweep(sweepCtx, 3)
	require.NoError(t, err, "Sweep while a row is locked")
	assert.Equal(t, 9, n)
	require.NoError(t, tx.Rollback(ctx))
	n, err = s.Sweep(ctx, 3)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "Sweep once the row is free")
}

func TestBackgroundSweeper(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool, pgstore.WithSweeper(10*time.Millisecond, 4))
	insertRecords(t, ctx, pool, table, "expired", 20, -time.Second, -time.Second)
	insertRecords(t, ctx, pool, table, "live", 3, time.Hour, time.Minute)
	eventually(t, 10*time.Second, "the sweeper to delete the expired records", func() bool {
		return count(t, ctx, pool, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()) == 3
	})
	// Close stops the sweeper and waits for it; goleak, in TestMain, checks
	// that it is gone.
	require.NoError(t, s.Close())
}

// A Complete changes no indexed column (unless the record's expiry moves to
// another minute), so PostgreSQL makes its UPDATE a HOT one, which writes no
// index entry, whenever the row's page has room for the new version.
func TestCompleteIsHOTUpdate(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	const n = 100
	for i := range n {
		id := scopeID("hot" + strconv.Itoa(i))
		tok := acquire(t, ctx, s, id, "fp")
		require.NoError(t, s.Complete(ctx, id, tok, &engine.Response{Status: 201, Body: []byte(strings.Repeat("b", 1024))}, time.Hour))
	}
	var upd, hot int64
	// The backends send their statistics within a second or so.
	eventually(t, 10*time.Second, "the statistics to count the updates", func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			pgx.Identifier{table}.Sanitize()).Scan(&upd, &hot))
		return upd >= n
	})
	assert.Equal(t, int64(n), upd, "updates")
	assert.Greater(t, hot, int64(n/2), "HOT updates of %d", upd)
}
