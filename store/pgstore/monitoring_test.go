package pgstore_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The queries of the Monitoring section of the package's README.
const (
	sizeQuery = `SELECT count(*) FILTER (WHERE expires_at > statement_timestamp()) AS records,
       count(*) FILTER (WHERE expires_at > statement_timestamp() AND state = 'in_flight') AS in_flight,
       pg_total_relation_size('idempotency_records'::regclass) AS bytes
FROM idempotency_records;`
	estimateQuery = `SELECT reltuples::bigint AS records, pg_total_relation_size(oid) AS bytes
FROM pg_class WHERE oid = 'idempotency_records'::regclass;`
)

// TestMonitoringQueriesDocumented: the queries tested below are those the
// package's README gives.
func TestMonitoringQueriesDocumented(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, q := range []string{sizeQuery, estimateQuery} {
		assert.Contains(t, string(readme), "```sql\n"+q+"\n```")
	}
}

// TestMonitoringQueries: the documented queries report the records, those
// in flight and the bytes of a store's table.
func TestMonitoringQueries(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	ident := pgx.Identifier{table}.Sanitize()
	on := func(q string) string {
		q = strings.ReplaceAll(q, "'idempotency_records'", "'"+ident+"'")
		return strings.ReplaceAll(q, "idempotency_records", ident)
	}

	for _, key := range []string{"a", "b", "c"} {
		id := scopeID(key)
		require.NoError(t, s.Complete(ctx, id, acquire(t, ctx, s, id, "fp"), created(`{"id":1}`), time.Hour))
	}
	acquire(t, ctx, s, scopeID("running"), "fp")
	// A record that expires at once, and stays until a sweep.
	expired := scopeID("expired")
	require.NoError(t, s.Complete(ctx, expired, acquire(t, ctx, s, expired, "fp"), created("{}"), time.Microsecond))

	var records, inFlight, bytes int64
	eventually(t, 5*time.Second, "the record to expire", func() bool {
		require.NoError(t, pool.QueryRow(ctx, on(sizeQuery)).Scan(&records, &inFlight, &bytes))
		return records == 4
	})
	assert.Equal(t, int64(1), inFlight, "records in flight")
	assert.Positive(t, bytes)
	assert.Equal(t, 5, count(t, ctx, pool, "SELECT count(*) FROM "+ident), "rows, the expired one included")

	_, err := pool.Exec(ctx, "ANALYZE "+ident)
	require.NoError(t, err)
	var estimate, estimateBytes int64
	require.NoError(t, pool.QueryRow(ctx, on(estimateQuery)).Scan(&estimate, &estimateBytes))
	assert.Equal(t, int64(5), estimate, "estimated records after ANALYZE, the expired one included")
	assert.Equal(t, bytes, estimateBytes)
}
