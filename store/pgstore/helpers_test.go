package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/store/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds each test's work with the database.
const testTimeout = 30 * time.Second

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// poolConfig returns the configuration of a pool on the test database, or
// skips t (fails it, in CI) when there is none.
func poolConfig(t testing.TB) *pgxpool.Config {
	t.Helper()
	url := servicetest.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		servicetest.Unavailable(t, "PostgreSQL", err)
	}
	return cfg
}

// newPool connects a pool, closed by t's cleanup, to the test database; each
// configure function may change its configuration first.
func newPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg := poolConfig(t)
	for _, f := range configure {
		f(cfg)
	}
	return connect(t, cfg)
}

func connect(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		servicetest.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func maxConns(n int32) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) { c.MaxConns = n }
}

// uniqueName returns a table name that no other test or run uses.
func uniqueName(t testing.TB, prefix string) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// newStore returns a Store on a table of its own, created with Migrate and
// dropped by t's cleanup.
func newStore(t testing.TB, pool *pgxpool.Pool, opts ...pgstore.Option) (pgstore.Store, string) {
	t.Helper()
	table := uniqueName(t, "pgstore_test_")
	s, err := pgstore.New(pool, append([]pgstore.Option{pgstore.WithTable(table)}, opts...)...)
	require.NoError(t, err)
	dropOnCleanup(t, pool, table)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.Migrate(testContext(t)))
	return s, table
}

// dropOnCleanup drops table, and with it its token sequence, when t ends.
func dropOnCleanup(t testing.TB, pool *pgxpool.Pool, table string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("drop table %s: %v", table, err)
		}
	})
}

func scopeID(key string) engine.ID {
	return engine.ID{Scope: "pgstore-test", Key: key}
}

func acquire(t testing.TB, ctx context.Context, s engine.Store, id engine.ID, fp string) engine.Token {
	t.Helper()
	c, err := s.Claim(ctx, id, fp, time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status, "Claim(%v) status", id)
	return c.Token
}

func created(body string) *engine.Response {
	return &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}

// count returns the result of a count(*) query.
func count(t testing.TB, ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
	return n
}

// eventually polls cond every few milliseconds until it holds, or fails t
// after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
