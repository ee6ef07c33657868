package redisstore_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// A slot that migrates to a master that has never run the Store's
// functions: during the migration (ASK) and after it (MOVED), calls load the
// library on the node that answered and succeed; through a client with
// ContextTimeoutEnabled and one without (the Store then calls the node
// itself, and the Cluster client when the node redirects it).
func TestSlotMigration(t *testing.T) {
	t.Parallel()
	for _, timeouts := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", timeouts), func(t *testing.T) {
			t.Parallel()
			slotMigration(t, timeouts)
		})
	}
}

func slotMigration(t *testing.T, timeouts bool) {
	addrs := startCluster(t)
	// A deadline, as the engine gives every call: without one, a client
	// without ContextTimeoutEnabled is called as it is.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: timeouts})
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
	migrate(t, ctx, c, s, acked, nil)
}

// A master added with CLUSTER MEET (rather than redis-cli --cluster
// add-node, which copies the functions to it) owns no slot until one
// migrates to it, so no slot map lists it: while a slot migrates to it, the
// calls that ASK sends there load the library there all the same, and
// succeed; and so do those that MOVED sends there afterwards. With
// ContextTimeoutEnabled and without.
func TestSlotMigrationToMetNode(t *testing.T) {
	t.Parallel()
	for _, timeouts := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", timeouts), func(t *testing.T) {
			t.Parallel()
			slotMigrationToMetNode(t, timeouts)
		})
	}
}

func slotMigrationToMetNode(t *testing.T, timeouts bool) {
	addrs := startCluster(t)
	node := startRedis(t, "--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
	// A deadline, as the engine gives every call: without one, a client
	// without ContextTimeoutEnabled is called as it is.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	meet(t, ctx, addrs, node)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: timeouts})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.WithPrefix("{meet}:"))
	require.NoError(t, err)
	acked, err := redisstore.New(c, redisstore.WithPrefix("{meet}:"), redisstore.WithReplicaAck(1, 10*time.Millisecond))
	require.NoError(t, err)
	target := redis.NewClient(&redis.Options{Addr: node.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { target.Close() })
	migrate(t, ctx, c, s, acked, target)
}

// meet adds node to the cluster of addrs with CLUSTER MEET, and waits until
// every node knows every other one, and node knows the slots.
func meet(t *testing.T, ctx context.Context, addrs []string, node *redisProcess) {
	t.Helper()
	all := append(append([]string(nil), addrs...), node.Addr)
	admin := redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: true})
	defer admin.Close()
	require.NoError(t, admin.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(node.Port)).Err())
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range all {
		n := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		for {
			info, err := n.ClusterInfo(ctx).Result()
			nodes, nerr := n.ClusterNodes(ctx).Result()
			if err == nil && nerr == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(all))+"\r") &&
				!strings.Contains(nodes, "handshake") && !strings.Contains(nodes, "noaddr") {
				break
			}
			if time.Now().After(deadline) {
				n.Close()
				t.Fatalf("node %s does not know the cluster of %d nodes: %v, %v\n%s\n%s", addr, len(all), err, nerr, info, nodes)
			}
			time.Sleep(20 * time.Millisecond)
		}
		n.Close()
	}
}

// migrate moves the slot of the Stores' records (one hash tag) from its
// master to target, or to another master when target is nil, whose
// functions it flushes, and claims keys of the slot before, during and
// after the migration.
func migrate(t *testing.T, ctx context.Context, c *redis.ClusterClient, s, acked redisstore.Store, target *redis.Client) {
	t.Helper()
	refused := func(when string) {
		t.Helper()
		id := engine.ID{Key: "acked-" + when}
		_, err := acked.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.ErrorIs(t, err, redisstore.ErrNotReplicated, "a claim WithReplicaAck %s", when)
		_, err = s.Lookup(ctx, id)
		require.ErrorIs(t, err, engine.ErrNotFound, "the refused claim %s is released", when)
	}
	before := engine.ID{Key: "before"}
	cl, err := s.Claim(ctx, before, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, before, cl.Token, &engine.Response{Status: http.StatusCreated}, time.Hour))
	// A record in flight with a step, and one without, both on the source.
	withSteps, noSteps := engine.ID{Key: "with-steps"}, engine.ID{Key: "no-steps-yet"}
	ws, err := s.Claim(ctx, withSteps, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, withSteps, ws.Token, doneStep("a", "1")))
	ns, err := s.Claim(ctx, noSteps, "fp", time.Minute, time.Hour)
	require.NoError(t, err)

	slot, err := c.ClusterKeySlot(ctx, s.RecordKey(before)).Result()
	require.NoError(t, err)
	source, err := c.MasterForKey(ctx, s.RecordKey(before))
	require.NoError(t, err)
	var mu sync.Mutex
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
	during := engine.ID{Key: "during"}
	cl, err = s.Claim(ctx, during, "fp", time.Minute, time.Hour)
	require.NoError(t, err, "a new key while its slot migrates")
	require.Equal(t, engine.Acquired, cl.Status)
	require.NoError(t, s.Complete(ctx, during, cl.Token, &engine.Response{Status: http.StatusCreated}, time.Hour))
	got, err := s.Claim(ctx, before, "fp", time.Minute, time.Hour)
	require.NoError(t, err, "an old key while its slot migrates")
	assert.Equal(t, engine.Completed, got.Status)
	require.NoError(t, target.FunctionFlush(ctx).Err())
	refused("during the migration")
	// A record and its steps key, both on the source, take more steps.
	require.NoError(t, s.SaveStep(ctx, withSteps, ws.Token, doneStep("b", "2")), "a step while the slot migrates")
	// The first step of a record on the source would create its steps key
	// there, which Redis refuses in a slot that migrates: a store error
	// (the engine tries again), until the slot has moved.
	err = s.SaveStep(ctx, noSteps, ns.Token, doneStep("a", "1"))
	require.Error(t, err, "a first step while the slot migrates")
	t.Logf("a first step while the slot migrates: %v", err)
	assert.NotErrorIs(t, err, engine.ErrLeaseLost)
	assert.NotErrorIs(t, err, engine.ErrNotStorable)
	assert.NotErrorIs(t, err, redisstore.ErrCorruptRecord)

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
	for _, id := range []engine.ID{before, during} {
		got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err, "%s after the migration", id.Key)
		assert.Equal(t, engine.Completed, got.Status, id.Key)
	}
	require.NoError(t, target.FunctionFlush(ctx).Err())
	refused("after the migration")
	// The steps moved with their records.
	require.NoError(t, s.SaveStep(ctx, noSteps, ns.Token, doneStep("a", "1")), "a first step after the migration")
	require.NoError(t, s.Release(ctx, withSteps, ws.Token))
	ws, err = s.Claim(ctx, withSteps, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Len(t, ws.Steps, 2, "the steps after the migration")
	require.NoError(t, target.FunctionFlush(ctx).Err())
	after := engine.ID{Key: "after"}
	cl, err = s.Claim(ctx, after, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, cl.Status)
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
