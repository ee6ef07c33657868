// Package teststores gives tests a Store of each kind, each on state of its
// own (a fresh memstore, a PostgreSQL table of its own, a Redis key prefix of
// its own, an SQLite file of its own, a MySQL table of its own) that is
// removed when the test ends. The PostgreSQL, Redis and MySQL stores use the
// servers that internal/testkit/servicetest finds; without them the test
// skips, or fails when services are required.
package teststores

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/mysqlstore"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/redisstore"
	"github.com/idemkit/idempotency/store/sqlitestore"
)

// Kind names a store and makes one for a test.
type Kind struct {
	Name string
	New  func(t testing.TB) engine.Store
}

// All returns every kind of store: memory, postgres, redis, sqlite, mysql.
func All() []Kind {
	return []Kind{
		{"memory", func(t testing.TB) engine.Store { return Memory(t) }},
		{"postgres", func(t testing.TB) engine.Store { return Postgres(t) }},
		{"redis", func(t testing.TB) engine.Store { return Redis(t) }},
		{"sqlite", func(t testing.TB) engine.Store { return SQLite(t) }},
		{"mysql", func(t testing.TB) engine.Store { return MySQL(t) }},
	}
}

// SQLite returns an sqlitestore on a file of its own, in a directory
// removed when t ends, and closed before.
func SQLite(t testing.TB, opts ...sqlitestore.Option) sqlitestore.Store {
	t.Helper()
	return SQLiteOn(t, filepath.Join(t.TempDir(), "records.db"), opts...)
}

// SQLiteOn returns an sqlitestore on the file at path, closed when t ends.
// Two stores on one file share their records.
func SQLiteOn(t testing.TB, path string, opts ...sqlitestore.Option) sqlitestore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sqlitestore.Open(ctx, path, opts...)
	if err != nil {
		t.Fatalf("sqlitestore.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// MySQLDB returns a database handle on the test MySQL (MariaDB) server,
// closed when t ends; foundRows sets the driver's clientFoundRows, which
// makes the server count the rows an UPDATE matched rather than changed.
func MySQLDB(t testing.TB, foundRows bool) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(servicetest.MySQLDSN(t))
	if err != nil {
		t.Fatalf("%s is not a MySQL DSN", servicetest.EnvMySQLDSN)
	}
	cfg.ClientFoundRows = foundRows
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("%s: %v", servicetest.EnvMySQLDSN, err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		servicetest.Unavailable(t, "MySQL", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// MySQL returns a mysqlstore on a table of its own, migrated, and dropped
// when t ends.
func MySQL(t testing.TB, opts ...mysqlstore.Option) mysqlstore.Store {
	t.Helper()
	return MySQLOn(t, MySQLDB(t, false), UniqueName(t, "idempotency_t_"), opts...)
}

// MySQLOn returns a mysqlstore on table in db, migrated; the table is
// dropped when t ends. Two stores on one table share their records.
func MySQLOn(t testing.TB, db *sql.DB, table string, opts ...mysqlstore.Option) mysqlstore.Store {
	t.Helper()
	s, err := mysqlstore.New(db, append([]mysqlstore.Option{mysqlstore.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("mysqlstore.New: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// Memory returns a memstore closed when t ends.
func Memory(t testing.TB, opts ...memstore.Option) memstore.Store {
	t.Helper()
	s, err := memstore.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// PostgresPool returns a pool on the test database, closed when t ends.
func PostgresPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(servicetest.PostgresURL(t))
	if err != nil {
		// The URL may hold a password: do not print it.
		t.Fatalf("%s is not a PostgreSQL URL", servicetest.EnvPostgresURL)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	// Tests need the store's semantics, not durability across a crash of
	// the test server: not waiting for each commit's fsync keeps them fast
	// on a shared disk. Nothing the stores decide depends on it.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	// pgx ends a statement whose context is cancelled by closing its
	// connection; without this, PostgreSQL notices only when the statement
	// ends, and holds its locks until then (what pgstore's documentation
	// recommends for the transactional mode).
	cfg.ConnConfig.RuntimeParams["client_connection_check_interval"] = "100ms"
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

// Postgres returns a pgstore on a table of its own in a pool of its own,
// migrated, and dropped when t ends.
func Postgres(t testing.TB, opts ...pgstore.Option) pgstore.Store {
	t.Helper()
	return PostgresOn(t, PostgresPool(t, 64), UniqueName(t, "idempotency_t_"), opts...)
}

// PostgresOn returns a pgstore on table in pool, migrated; the table is
// dropped when t ends. Two stores on one table share their records.
func PostgresOn(t testing.TB, pool *pgxpool.Pool, table string, opts ...pgstore.Option) pgstore.Store {
	t.Helper()
	s, err := pgstore.New(pool, append([]pgstore.Option{pgstore.WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

// RedisClient returns a client of the test Redis, closed when t ends.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(servicetest.RedisURL(t))
	if err != nil {
		t.Fatalf("%s is not a Redis URL", servicetest.EnvRedisURL)
	}
	opt.ContextTimeoutEnabled = true
	opt.PoolSize = 64
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		servicetest.Unavailable(t, "Redis", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Redis returns a redisstore under a key prefix of its own, whose keys are
// deleted when t ends.
func Redis(t testing.TB, opts ...redisstore.Option) redisstore.Store {
	t.Helper()
	c := RedisClient(t)
	return RedisOn(t, c, UniqueName(t, "idempotency-t:")+":", opts...)
}

// RedisOn returns a redisstore on client under prefix; the keys under prefix
// are deleted when t ends. Two stores with one prefix share their records.
func RedisOn(t testing.TB, client *redis.Client, prefix string, opts ...redisstore.Option) redisstore.Store {
	t.Helper()
	s, err := redisstore.New(client, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		for len(keys) > 0 {
			n := min(len(keys), 1000)
			client.Unlink(ctx, keys[:n]...)
			keys = keys[n:]
		}
	})
	return s
}

// UniqueName returns prefix followed by random letters, for a table or key
// prefix that no other test or run uses.
func UniqueName(t testing.TB, prefix string) string { return prefix + randomHex(t, 6) }

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
