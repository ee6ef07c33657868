package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/storetest"
)

// The suite on each way a claim reads the key (the Store chooses between
// them as it goes; TestConformanceWhileSweeping lets it).
func TestConformance(t *testing.T) {
	pool := newPool(t)
	for _, path := range pgstore.ClaimPaths {
		t.Run(path.Name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) engine.Store {
				s, _ := newStore(t, pool)
				path.Fix(s)
				return s
			})
		})
	}
}

// The suite again, with a sweeper deleting expired records as fast as it
// can: sweeping must never change an answer.
func TestConformanceWhileSweeping(t *testing.T) {
	pool := newPool(t)
	storetest.Run(t, func(t *testing.T) engine.Store {
		s, _ := newStore(t, pool, pgstore.WithSweeper(10*time.Millisecond, 2))
		return s
	})
}

func TestNewRejects(t *testing.T) {
	pool := newPool(t)
	for _, tc := range []struct {
		name string
		opts []pgstore.Option
	}{
		{"empty table", []pgstore.Option{pgstore.WithTable("")}},
		{"quote", []pgstore.Option{pgstore.WithTable(`a"b`)}},
		{"injection", []pgstore.Option{pgstore.WithTable("t; DROP TABLE x")}},
		{"leading digit", []pgstore.Option{pgstore.WithTable("1t")}},
		{"three parts", []pgstore.Option{pgstore.WithTable("a.b.c")}},
		{"empty schema", []pgstore.Option{pgstore.WithTable(".t")}},
		{"too long", []pgstore.Option{pgstore.WithTable(strings.Repeat("t", 49))}},
		{"non-ASCII", []pgstore.Option{pgstore.WithTable("tablé")}},
		{"lock timeout", []pgstore.Option{pgstore.WithLockTimeout(0)}},
		{"idle timeout", []pgstore.Option{pgstore.WithIdleTimeout(-time.Second)}},
		{"sweep interval", []pgstore.Option{pgstore.WithSweeper(-time.Second, 10)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := pgstore.New(pool, tc.opts...)
			if err == nil {
				s.Close()
				t.Fatalf("New() error = nil, want an error")
			}
			assert.True(t, strings.HasPrefix(err.Error(), "pgstore: "), "error %q lacks the package prefix", err)
		})
	}
	_, err := pgstore.New(nil)
	assert.Error(t, err, "New(nil)")
}

func TestSchema(t *testing.T) {
	got, err := pgstore.Schema("app.Records_1")
	require.NoError(t, err)
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "app"."Records_1"`,
		`CREATE SEQUENCE IF NOT EXISTS "app"."Records_1_token_seq"`,
		`CREATE INDEX IF NOT EXISTS "Records_1_sweep_at_idx" ON "app"."Records_1" (sweep_at)`,
		`DROP INDEX IF EXISTS "app"."Records_1_expires_at_idx"`,
	} {
		assert.Contains(t, got, want)
	}
	assert.NotContains(t, got, "{{")
	_, err = pgstore.Schema("bad name")
	assert.Error(t, err)
}

// Migrate in a schema of the caller's, with a mixed-case name: every name is
// quoted, so the Store finds what Migrate created.
func TestQualifiedTable(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	schema := uniqueName(t, "pgstore_schema_")
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		assert.NoError(t, err)
	})
	s, err := pgstore.New(pool, pgstore.WithTable(schema+".Records"))
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Migrate(ctx))
	id := scopeID("qualified")
	tok := acquire(t, ctx, s, id, "fp")
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
}

func TestMigrateConcurrently(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t, maxConns(8))
	table := uniqueName(t, "pgstore_test_")
	dropOnCleanup(t, pool, table)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			s, err := pgstore.New(pool, pgstore.WithTable(table))
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			errs <- s.Migrate(ctx)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err, "concurrent Migrate")
	}
	// And once more, on a table that exists.
	s, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Migrate(ctx), "Migrate of an existing table")
	acquire(t, ctx, s, scopeID("after-migrate"), "fp")
}

// Two instances of an API, each with its own pool, share one table: among
// concurrent claimers spread over both, exactly one acquires.
func TestTwoStoresShareTable(t *testing.T) {
	ctx := testContext(t)
	poolA, poolB := newPool(t, maxConns(8)), newPool(t, maxConns(8))
	a, table := newStore(t, poolA)
	b, err := pgstore.New(poolB, pgstore.WithTable(table))
	require.NoError(t, err)
	defer b.Close()
	stores := []pgstore.Store{a, b}

	const claimers, rounds = 64, 10
	for round := range rounds {
		id := scopeID(fmt.Sprintf("shared-%d", round))
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			mu       sync.Mutex
			acquired = map[int]int{}
			inFlight int
		)
		for i := range claimers {
			wg.Go(func() {
				<-start
				c, err := stores[i%2].Claim(ctx, id, "fp", time.Minute, time.Hour)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					t.Errorf("round %d: Claim error = %v", round, err)
				case c.Status == engine.Acquired:
					acquired[i%2]++
				case c.Status == engine.InFlight:
					inFlight++
				default:
					t.Errorf("round %d: Claim status = %v, want acquired or in flight", round, c.Status)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, acquired[0]+acquired[1], "round %d: claimers that acquired (per store: %v)", round, acquired)
		require.Equal(t, claimers-1, inFlight, "round %d: claimers told in flight", round)
	}
}

// A row that a concurrent claimer commits while Claim's statement runs is not
// in that statement's snapshot: the statement returns nothing, and Claim must
// run it again rather than answer wrongly or fail.
func TestClaimSeesRowCommittedDuringStatement(t *testing.T) {
	for _, path := range pgstore.ClaimPaths {
		t.Run(path.Name, func(t *testing.T) { testClaimSeesRowCommittedDuringStatement(t, path.Fix) })
	}
}

func testClaimSeesRowCommittedDuringStatement(t *testing.T, fix func(pgstore.Store)) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	fix(s)
	id := scopeID("snapshot")

	// A claimer that has inserted, and not yet committed, a completed record.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+`
		(scope, key, fingerprint, state, token, lease_until, created_at, expires_at, status, body)
		VALUES ($1, $2, 'fp', 'completed', 1, now(), now(), now() + interval '1 hour', 201, 'done')`,
		[]byte(id.Scope), []byte(id.Key))
	require.NoError(t, err)

	type result struct {
		c   engine.Claim
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		done <- result{c, err}
	}()
	// Claim's INSERT waits for the uncommitted row's transaction.
	eventually(t, 10*time.Second, "Claim waiting on the uncommitted row", func() bool {
		return count(t, ctx, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, table) > 0
	})
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, engine.Completed, r.c.Status)
	assert.Equal(t, []byte("done"), r.c.Response.Body)
}

func TestCompleteOfUnknownOrExpiredToken(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	id := scopeID("expired-record")
	tok := acquire(t, ctx, s, id, "fp")
	require.NoError(t, s.Release(ctx, id, tok))
	assert.ErrorIs(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour), engine.ErrLeaseLost, "Complete after Release")
	// The record's time to live ends while it is in flight: its holder can
	// no longer complete it, and the next claimer starts afresh.
	c, err := s.Claim(ctx, id, "fp", 10*time.Millisecond, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	eventually(t, 5*time.Second, "record expiry", func() bool {
		return count(t, ctx, pool, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+`
			WHERE key = $1 AND expires_at <= statement_timestamp()`, []byte(id.Key)) == 1
	})
	assert.ErrorIs(t, s.Extend(ctx, id, c.Token, time.Minute), engine.ErrLeaseLost)
	assert.ErrorIs(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour), engine.ErrLeaseLost)
	assert.ErrorIs(t, s.Release(ctx, id, c.Token), engine.ErrLeaseLost)
	next := acquire(t, ctx, s, id, "other")
	assert.Greater(t, next, c.Token)
}

func TestClaimAfterClose(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t))
	id := scopeID("closing")
	tok := acquire(t, ctx, s, id, "fp")
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "second Close")
	_, err := s.Claim(ctx, scopeID("after-close"), "fp", time.Minute, time.Hour)
	assert.ErrorIs(t, err, engine.ErrStoreClosed)
	// A request that was running during the shutdown is still recorded.
	assert.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
}

func TestTxFromContextInLeaseMode(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t))
	id := scopeID("lease-bind")
	tok := acquire(t, ctx, s, id, "fp")
	bound := s.Bind(ctx, id, tok)
	_, ok := pgstore.TxFromContext(bound)
	assert.False(t, ok, "TxFromContext in lease mode")
}

// An instance that starts while another serves requests, in transactional
// mode with a handler's transaction open, migrates without waiting for it.
func TestMigrateDoesNotWaitForWriters(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool, pgstore.WithTransactions())
	acquire(t, ctx, s, scopeID("open"), "fp") // a transaction that wrote to the table

	starting, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	defer starting.Close()
	migrateCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, starting.Migrate(migrateCtx))
}

// The package's README shows the default schema to teams that run their own
// migrations: it must be the one Migrate applies.
func TestDocumentedSchema(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	schema, err := pgstore.Schema(pgstore.DefaultTable)
	require.NoError(t, err)
	want := "```sql\n" + strings.TrimSpace(schema) + "\n```"
	assert.Contains(t, string(readme), want, "README.md does not show Schema(defaultTable)")
}
