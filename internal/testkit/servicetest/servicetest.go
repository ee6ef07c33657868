// Package servicetest finds the PostgreSQL, Redis and MySQL (MariaDB) servers that the store
// tests talk to, and decides what a test does when one is missing: it skips,
// with a message that says how to run it, unless IDEMPOTENCY_REQUIRE_SERVICES
// is set (as CI sets it), in which case it fails.
package servicetest

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Environment variables read by this package.
const (
	EnvPostgresURL     = "IDEMPOTENCY_POSTGRES_URL"
	EnvRedisURL        = "IDEMPOTENCY_REDIS_URL"
	EnvMySQLDSN        = "IDEMPOTENCY_MYSQL_DSN"
	EnvRequireServices = "IDEMPOTENCY_REQUIRE_SERVICES"
)

// Default addresses, those of a development machine or CI runner.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	// DefaultMySQLDSN is in github.com/go-sql-driver/mysql's form.
	DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test"
)

// PostgresURL returns the URL of the PostgreSQL server for tests, after
// checking that something listens there.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return lookup(t, EnvPostgresURL, DefaultPostgresURL, "PostgreSQL")
}

// RedisURL returns the URL of the Redis server for tests, after checking that
// something listens there.
func RedisURL(t testing.TB) string {
	t.Helper()
	return lookup(t, EnvRedisURL, DefaultRedisURL, "Redis")
}

// MySQLDSN returns the data source name of the MySQL or MariaDB server for
// tests, after checking that something listens at its address.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvMySQLDSN)
	if dsn == "" {
		dsn = DefaultMySQLDSN
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		// The DSN may hold a password: never print it.
		Unavailable(t, "MySQL", errBadURL(EnvMySQLDSN))
		return ""
	}
	conn, err := net.DialTimeout("tcp", cfg.Addr, 2*time.Second)
	if err != nil {
		Unavailable(t, "MySQL", err)
		return ""
	}
	conn.Close()
	return dsn
}

// Required reports whether missing services fail tests instead of skipping
// them.
func Required() bool {
	v := os.Getenv(EnvRequireServices)
	return v != "" && v != "0" && v != "false"
}

// Unavailable skips t, or fails it when services are required, saying why
// the service named what is unusable.
func Unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is required (%s is set) but unusable: %v", what, EnvRequireServices, err)
	}
	t.Skipf("%s unusable (%v); start it or point the tests at one with %s / %s / %s, "+
		"and set %s=1 to make this a failure", what, err, EnvPostgresURL, EnvRedisURL, EnvMySQLDSN, EnvRequireServices)
}

func lookup(t testing.TB, env, def, what string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		// The URL may hold a password: never print it.
		Unavailable(t, what, errBadURL(env))
		return ""
	}
	host := u.Host
	if u.Port() == "" {
		port := "5432"
		if u.Scheme == "redis" || u.Scheme == "rediss" {
			port = "6379"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	conn, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		Unavailable(t, what, err)
		return ""
	}
	conn.Close()
	return raw
}

type errBadURL string

func (e errBadURL) Error() string { return "servicetest: " + string(e) + " is not valid" }
