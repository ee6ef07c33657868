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
	// The same records through WithReplicaAck, which talks to one node
	// itself: with no replica in this cluster, every claim it reaches a
	// node with is released and refused as not replicated, never failed by
	// a redirection or a missing function.
	acked, err := redisstore.New(c, redisstore.WithPrefix("{migration}:"), redisstore.WithReplicaAck(1, 10*time.Millisecond))
	require.NoError(t, err)
	migrate(t, ctx, c, s, acked)
}

func migrate(t *testing.T, ctx context.Context, c *redis.ClusterClient, s, acked *redisstore.Store) {
	t.Helper()
	refused := func(when string) {
		t.Helper()
		id := server.ID{Key: "acked-" + when}
		_, err := acked.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.ErrorIs(t, err, redisstore.ErrNotReplicated, "a claim WithReplicaAck %s", when)
		_, err = s.Lookup(ctx, id)
		require.ErrorIs(t, err, server.ErrNotFound, "the refused claim %s is released", when)
	}
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
	require.NoError(t, target.FunctionFlush(ctx).Err())
	refused("during the migration")

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
	require.NoError(t, target.FunctionFlush(ctx).Err())
	refused("after the migration")
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
