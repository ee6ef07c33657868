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

// BenchmarkStatementParts measures the backend CPU of each statement of a
// first execution on the store's table, the Store's and the minimal ones,
// in rounds of 320 operations of each kind on benchGoroutines goroutines,
// taking turns: selmiss, the claim's read of a key that has no record (the
// sized version); insOurs, the claim's INSERT that returns the table's size
// and the backend, and insLean, the same INSERT returning the token alone;
// insMin, the least INSERT of a record; updOurs, the completion's UPDATE,
// and updMin, the least one. It reports each one's backend µs per
// operation, so that a change to a statement shows what it costs:
//
//	go test ./store/pgstore -run '^$' -bench BenchmarkStatementParts -benchtime 3200x -count 2
func BenchmarkStatementParts(b *testing.B) {
	ctx := testContext(b)
	var bs backends
	pool := newPool(b, maxConns(benchGoroutines), func(c *pgxpool.Config) {
		c.MinConns = benchGoroutines
		c.AfterConnect = bs.afterConnect
	})
	_, table := newStore(b, pool)
	insertRecords(b, ctx, pool, table, "fill", benchFill, time.Hour, time.Minute)
	_, err := pool.Exec(ctx, "ANALYZE "+pgx.Identifier{table}.Sanitize())
	require.NoError(b, err)
	t := pgx.Identifier{table}.Sanitize()
	sweep := func(e string) string {
		return "date_bin(interval '1 minute', " + e + ", timestamptz 'epoch') + interval '1 minute'"
	}
	sql := map[string]string{
		"selmiss": `SELECT token, state, fingerprint, lease_until, expires_at, coalesce(status, 0), headers, body, body_omitted, statement_timestamp(), pg_relation_size(tableoid) FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		"insOurs": `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, lease_until, created_at, expires_at, sweep_at)
VALUES ($1, $2, $3, 'in_flight', nextval('` + table + `_token_seq'),
	statement_timestamp() + $4::bigint * interval '1 microsecond', statement_timestamp(),
	statement_timestamp() + $5::bigint * interval '1 microsecond',
	` + sweep("statement_timestamp() + ($5::bigint - $4::bigint) * interval '1 microsecond'") + `)
ON CONFLICT (scope, key) DO NOTHING
RETURNING token, pg_relation_size(tableoid), pg_backend_pid(), transaction_timestamp()`,
		"insLean": `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, lease_until, created_at, expires_at, sweep_at)
VALUES ($1, $2, $3, 'in_flight', nextval('` + table + `_token_seq'),
	statement_timestamp() + $4::bigint * interval '1 microsecond', statement_timestamp(),
	statement_timestamp() + $5::bigint * interval '1 microsecond',
	` + sweep("statement_timestamp() + ($5::bigint - $4::bigint) * interval '1 microsecond'") + `)
ON CONFLICT (scope, key) DO NOTHING
RETURNING token`,
		"insMin": `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, lease_until, created_at, expires_at)
		VALUES ($1, $2, $3, 'in_flight', nextval('` + table + `_token_seq'), now() + interval '1 minute', now(), now() + interval '1 hour')
		ON CONFLICT (scope, key) DO NOTHING RETURNING token`,
		"updOurs": `UPDATE ` + t + ` SET
	state = 'completed',
	lease_until = statement_timestamp(),
	expires_at = statement_timestamp() + $4::bigint * interval '1 microsecond',
	sweep_at = ` + sweep("statement_timestamp() + $4::bigint * interval '1 microsecond'") + `,
	status = $5, headers = $6, body = $7, body_omitted = $8
WHERE scope = $1 AND key = $2 AND token = $3
	AND state = 'in_flight' AND expires_at > statement_timestamp()`,
		"updMin": `UPDATE ` + t + ` SET state = 'completed', status = $4, headers = $5, body = $6
		WHERE scope = $1 AND key = $2 AND token = $3`,
	}
	resp := benchResponse()
	var seq atomic.Int64
	type job struct {
		key   []byte
		token int64
	}
	run := func(name string, jobs []job) {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range benchGoroutines {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(len(jobs)) {
						return
					}
					j := &jobs[i]
					var err error
					switch name {
					case "selmiss":
						rows, qerr := pool.Query(ctx, sql[name], []byte("bench"), j.key)
						if qerr == nil {
							for rows.Next() {
							}
							rows.Close()
							qerr = rows.Err()
						}
						err = qerr
					case "insOurs":
						var size int64
						var pid int32
						var st time.Time
						err = pool.QueryRow(ctx, sql[name], []byte("bench"), j.key, []byte("fp"), int64(60e6), int64(3660e6)).Scan(&j.token, &size, &pid, &st)
					case "insLean":
						err = pool.QueryRow(ctx, sql[name], []byte("bench"), j.key, []byte("fp"), int64(60e6), int64(3660e6)).Scan(&j.token)
					case "insMin":
						err = pool.QueryRow(ctx, sql[name], []byte("bench"), j.key, []byte("fp")).Scan(&j.token)
					case "updOurs":
						_, err = pool.Exec(ctx, sql[name], []byte("bench"), j.key, j.token, int64(3600e6), int32(201), []byte("h"), resp.Body, false)
					case "updMin":
						_, err = pool.Exec(ctx, sql[name], []byte("bench"), j.key, j.token, int32(201), []byte("h"), resp.Body)
					}
					if err != nil {
						b.Error(name, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	mk := func(n int) []job {
		js := make([]job, n)
		for i := range js {
			js[i].key = []byte("k" + strconv.FormatInt(seq.Add(1), 10))
		}
		return js
	}
	spent := map[string]time.Duration{}
	measure := func(name string, js []job) {
		c0, _ := bs.cpu()
		run(name, js)
		c1, _ := bs.cpu()
		spent[name] += c1 - c0
	}
	for round := 0; round <= b.N/320; round++ {
		a, m, l := mk(320), mk(320), mk(320)
		measure("selmiss", mk(320))
		measure("insOurs", a)
		measure("updOurs", a)
		measure("insMin", m)
		measure("updMin", m)
		measure("insLean", l)
	}
	for n, d := range spent {
		b.ReportMetric(float64(d.Nanoseconds())/1e3/float64((b.N/320+1)*320), n+"-µs")
	}
}
