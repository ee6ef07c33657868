package pgstore_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
)

// scans returns the sequential and index scans PostgreSQL has counted on
// table, after making the pool's only connection report its own.
func scans(t testing.TB, ctx context.Context, pool *pgxpool.Pool, table string) (seq, idx int64) {
	t.Helper()
	_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables
		WHERE relid = $1::regclass`, pgx.Identifier{table}.Sanitize()).Scan(&seq, &idx))
	return seq, idx
}

// Statistics taken while the table held one row make a sequential scan the
// cheapest plan of every statement. A plan made then and kept (as a
// prepared statement's generic plan is) reads the whole table on every
// request once it has grown. The Store's statements must use the index
// whatever the statistics say.
func TestPlansAsTableGrows(t *testing.T) {
	ctx := testContext(t)
	for _, mode := range []struct {
		name          string
		transactional bool
	}{
		{"lease mode", false},
		{"transactional mode", true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var opts []pgstore.Option
			if mode.transactional {
				opts = append(opts, pgstore.WithTransactions())
			}
			pool := newPool(t, maxConns(1)) // one connection: one backend's plans and counters
			s, table := newStore(t, pool, opts...)
			quoted := pgx.Identifier{table}.Sanitize()
			// No autovacuum, whose ANALYZE would make new plans in the middle.
			_, err := pool.Exec(ctx, "ALTER TABLE "+quoted+" SET (autovacuum_enabled = false)")
			require.NoError(t, err)
			require.NoError(t, s.Complete(ctx, scopeID("first"), acquire(t, ctx, s, scopeID("first"), "fp"), created(`{}`), time.Hour))
			_, err = pool.Exec(ctx, "ANALYZE "+quoted)
			require.NoError(t, err)

			round := func(n int, prefix string) {
				for i := range n {
					id := scopeID(prefix + string(rune('a'+i)))
					c, err := s.Claim(ctx, id, "fp", time.Nanosecond, time.Hour)
					require.NoError(t, err)
					if !mode.transactional {
						c, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour) // a takeover
						require.NoError(t, err)
						require.NoError(t, s.Extend(ctx, id, c.Token, time.Minute))
					}
					require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
					replay, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
					require.NoError(t, err)
					require.Equal(t, engine.Completed, replay.Status)
					_, err = s.Lookup(ctx, id)
					require.NoError(t, err)
					released := scopeID(prefix + "released " + string(rune('a'+i)))
					require.NoError(t, s.Release(ctx, released, acquire(t, ctx, s, released, "fp")))
				}
			}
			round(8, "small ") // more than the five custom plans after which PostgreSQL may keep a generic one

			_, err = pool.Exec(ctx, `INSERT INTO `+quoted+` (scope, key, fingerprint, state, token,
				lease_until, created_at, expires_at, status, body)
				SELECT 'grown', i::text::bytea, 'fp', 'completed', i, now(), now(), now() + interval '1 hour', 201,
					convert_to(repeat('x', 200), 'UTF8')
				FROM generate_series(1, 20000) AS i`)
			require.NoError(t, err)
			// The first claim on the grown table finds its size; from then
			// on the statements are planned for it.
			first := scopeID("grown first")
			require.NoError(t, s.Release(ctx, first, acquire(t, ctx, s, first, "fp")))
			seq0, idx0 := scans(t, ctx, pool, table)
			round(8, "grown ")
			seq1, idx1 := scans(t, ctx, pool, table)
			assert.Zero(t, seq1-seq0, "sequential scans of the grown table")
			assert.Positive(t, idx1-idx0, "index scans of the grown table")
		})
	}
}

// Timeouts at their extremes are taken as PostgreSQL's own limits, never
// refused by the server at the first Claim.
func TestExtremeTimeouts(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	for _, opts := range [][]pgstore.Option{
		{pgstore.WithLockTimeout(math.MaxInt64), pgstore.WithIdleTimeout(math.MaxInt64)},
		{pgstore.WithLockTimeout(time.Millisecond), pgstore.WithIdleTimeout(time.Nanosecond)},
	} {
		s, _ := newStore(t, pool, append(opts, pgstore.WithTransactions(), pgstore.WithSweeper(time.Nanosecond, math.MaxInt))...)
		id := scopeID("extreme timeouts")
		tok := acquire(t, ctx, s, id, "fp")
		require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
		require.NoError(t, s.Close())
	}
}

// A statement_timeout below the lock timeout: a duplicate that waits for
// the original's transaction is told 409 (InFlight), not a failure.
func TestTxStatementTimeoutBelowLockTimeout(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "300ms" })
	s, _ := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(time.Minute))
	id := scopeID("statement timeout")
	tok := acquire(t, ctx, s, id, "fp")
	dup, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.InFlight, dup.Status)
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
}

// idle_session_timeout closes a connection that sits idle in the pool;
// pgxpool pings only connections idle for more than a second. The
// statement sent on such a connection never ran: the Store tries once more.
func TestConnectionClosedWhileIdle(t *testing.T) {
	ctx := testContext(t)
	watcher := newPool(t)
	for _, transactional := range []bool{false, true} {
		var opts []pgstore.Option
		if transactional {
			opts = append(opts, pgstore.WithTransactions())
		}
		_, table := newStore(t, watcher)
		app := uniqueName(t, "pgstore_idle_")
		pool := newPool(t, maxConns(1), func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["idle_session_timeout"] = "100ms"
			c.ConnConfig.RuntimeParams["application_name"] = app
		})
		s, err := pgstore.New(pool, append(opts, pgstore.WithTable(table))...)
		require.NoError(t, err)
		defer s.Close()
		for i, op := range []func(engine.ID) error{
			func(id engine.ID) error {
				c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
				if err != nil {
					return err
				}
				return s.Release(ctx, id, c.Token) // gives the pool its connection back
			},
			func(id engine.ID) error { return s.Complete(ctx, id, 0, created(`{}`), time.Hour) },
			func(id engine.ID) error { _, err := s.Lookup(ctx, id); return err },
		} {
			eventually(t, 10*time.Second, "the server to close the idle connection", func() bool {
				return count(t, ctx, watcher, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == 0
			})
			err := op(scopeID("idle"))
			if errors.Is(err, engine.ErrLeaseLost) || errors.Is(err, engine.ErrNotFound) {
				err = nil // the statement ran
			}
			assert.NoError(t, err, "transactional %v, operation %d", transactional, i)
		}
	}
}

// A read-only server (a standby, or default_transaction_read_only) still
// replays what is stored, and says in flight what is; only a claim that
// must write fails.
func TestReadOnlyServer(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	done, running := scopeID("done"), scopeID("running")
	require.NoError(t, s.Complete(ctx, done, acquire(t, ctx, s, done, "fp"), created(`{"id":7}`), time.Hour))
	acquire(t, ctx, s, running, "fp")

	readOnly := newPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	})
	for _, opts := range [][]pgstore.Option{nil, {pgstore.WithTransactions()}} {
		ro, err := pgstore.New(readOnly, append(opts, pgstore.WithTable(table))...)
		require.NoError(t, err)
		defer ro.Close()
		c, err := ro.Claim(ctx, done, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, engine.Completed, c.Status)
		assert.Equal(t, created(`{"id":7}`), c.Response)
		c, err = ro.Claim(ctx, running, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, engine.InFlight, c.Status)
		assert.Positive(t, c.RetryAfter)
		_, err = ro.Claim(ctx, scopeID("new"), "fp", time.Minute, time.Hour)
		assert.ErrorContains(t, err, "read-only")
		rec, err := ro.Lookup(ctx, done)
		require.NoError(t, err)
		assert.True(t, rec.Completed)
	}
}
