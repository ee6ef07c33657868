package redisstore_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/redisstore"
)

// A slot that migrates to a master that has never run the Store's
// functions: during the migration (ASK) and after it (MOVED), calls load the
// library on the node that answered and succeed.
func TestSlotMigration(t *testing.T) {
	t.Parallel()
	addrs := startCluster(t)
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	// One hash tag: every record of the Store on one slot.
	s, err := redisstore.New(c, redisstore.WithPrefix("{migration}:"))
	require.NoError(t, err)
	migrate(t, ctx, c, s)
}

func migrate(t *testing.T, ctx context.Context, c *redis.ClusterClient, s *redisstore.Store) {
	t.Helper()
	before := server.ID{Key: "before"}
	cl, err := s.Claim(ctx, before, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, before, cl.Token, &server.Response{Status: http.StatusCreated}, time.Hour))

	slot, err := c.ClusterKeySlot(ctx, s.RecordKey(before)).Result()
	require.NoError(t, err)
	source, err := c.MasterForKey(ctx, s.RecordKey(before))
	require.NoError(t, err)
	var (
		mu     sync.Mutex
		target *redis.Client
	)
	require.NoError(t, c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Options().Addr != source.Options().Addr && target == nil {
			target = m
		}
		return nil
	}))
	// Only the source has run the functions: the target has never seen them.
	require.NoError(t, target.FunctionFlush(ctx).Err())
	sourceID, err := source.Do(ctx, "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	targetID, err := target.Do(ctx, "CLUSTER", "MYID").Text()
	require.NoError(t, err)

	require.NoError(t, target.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID).Err())
	require.NoError(t, source.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", targetID).Err())

	// Mid-migration: a new key is on the target (ASK), an old one on the
	// source.
	during := server.ID{Key: "during"}
	cl, err = s.Claim(ctx, during, "fp", time.Minute, time.Hour)
	require.NoError(t, err, "a new key while its slot migrates")
	require.Equal(t, server.Acquired, cl.Status)
	require.NoError(t, s.Complete(ctx, during, cl.Token, &server.Response{Status: http.StatusCreated}, time.Hour))
	got, err := s.Claim(ctx, before, "fp", time.Minute, time.Hour)
	require.NoError(t, err, "an old key while its slot migrates")
	assert.Equal(t, server.Completed, got.Status)

	// Move the keys, then the slot.
	keys, err := source.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	require.NoError(t, err)
	host, port := splitAddr(t, target.Options().Addr)
	for _, k := range keys {
		require.NoError(t, source.Migrate(ctx, host, port, k, 0, 5*time.Second).Err())
	}
	for _, n := range []*redis.Client{source, target} {
		require.NoError(t, n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", targetID).Err())
	}

	// After: MOVED to the target, which has the records.
	for _, id := range []server.ID{before, during} {
		got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err, "%s after the migration", id.Key)
		assert.Equal(t, server.Completed, got.Status, id.Key)
	}
	after := server.ID{Key: "after"}
	cl, err = s.Claim(ctx, after, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, server.Acquired, cl.Status)
}

func splitAddr(t *testing.T, addr string) (string, string) {
	t.Helper()
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[:i], addr[i+1:]
		}
	}
	t.Fatalf("address %q has no port", addr)
	return "", ""
}
