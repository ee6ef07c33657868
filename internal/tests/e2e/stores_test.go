package e2e_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/testkit/faultrun"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/redisstore"
)

// linkedStore is a store whose link from the middleware the test controls.
type linkedStore struct {
	store engine.Store
	link  faultrun.StoreLink
}

// linkedStores returns a store of each kind with a link the test can cut or
// slow: memstore through a faultstore, PostgreSQL and Redis through a TCP
// proxy of the test's own in front of the shared servers.
func linkedStores() []struct {
	name string
	new  func(t *testing.T) linkedStore
} {
	return []struct {
		name string
		new  func(t *testing.T) linkedStore
	}{
		{"memory", func(t *testing.T) linkedStore {
			fs := faultstore.New(teststores.Memory(t))
			return linkedStore{fs, faultrun.FaultStoreLink(fs)}
		}},
		{"postgres", linkedPostgres},
		{"redis", linkedRedis},
	}
}

// startTCPProxy starts a proxy in front of the host:port of a service URL.
func startTCPProxy(t *testing.T, host, port string) *faultnet.TCPProxy {
	t.Helper()
	p, err := faultnet.StartTCP(net.JoinHostPort(host, port))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

func linkedPostgres(t *testing.T) linkedStore {
	t.Helper()
	// The table is made, and dropped at the end, over a connection of its
	// own, which no fault reaches.
	direct := teststores.PostgresPool(t, 4)
	table := teststores.UniqueName(t, "idempotency_fault_")
	teststores.PostgresOn(t, direct, table)

	cfg, err := pgxpool.ParseConfig(servicetest.PostgresURL(t))
	require.NoError(t, err)
	proxy := startTCPProxy(t, cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off" // as teststores
	cfg.MaxConns = 32
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return linkedStore{s, proxy}
}

func linkedRedis(t *testing.T) linkedStore {
	t.Helper()
	// The key prefix is removed at the end over a client of its own.
	prefix := teststores.UniqueName(t, "idempotency-fault:") + ":"
	teststores.RedisOn(t, teststores.RedisClient(t), prefix)

	opt, err := redis.ParseURL(servicetest.RedisURL(t))
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(opt.Addr)
	require.NoError(t, err)
	proxy := startTCPProxy(t, host, port)
	opt.Addr = proxy.Addr()
	opt.ContextTimeoutEnabled = true // as teststores and the package documentation say
	opt.PoolSize = 64
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
	require.NoError(t, err)
	return linkedStore{s, proxy}
}
