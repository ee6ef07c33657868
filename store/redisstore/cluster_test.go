package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
	"github.com/idemkit/idempotency/store/storetest"
)

// clusterStarts lets two tests at a time start a cluster: the nodes of one
// agree on it by gossip, which a machine busy with many does slowly.
var clusterStarts = make(chan struct{}, 2)

// startCluster starts a Redis Cluster of three masters on loopback ports,
// waits until every node reports it healthy, and returns its addresses.
func startCluster(t *testing.T) []string {
	t.Helper()
	nodes := startClusterNodes(t, 0, 5*time.Second)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// startClusterNodes starts a Redis Cluster of three masters, each with
// replicas replicas, whose nodes count a node that does not answer for
// nodeTimeout as failed, waits until every node reports it healthy, and
// returns its nodes, the masters first.
func startClusterNodes(t *testing.T, replicas int, nodeTimeout time.Duration) []*redisProcess {
	t.Helper()
	needRedisServer(t, "redis-cli")
	clusterStarts <- struct{}{}
	defer func() { <-clusterStarts }()
	nodes := make([]*redisProcess, 3*(1+replicas))
	addrs := make([]string, len(nodes))
	for i := range nodes {
		// Each node has a directory, so a config file, of its own.
		nodes[i] = startRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", fmt.Sprint(nodeTimeout.Milliseconds()))
		addrs[i] = nodes[i].Addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", fmt.Sprint(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				c.Close()
				t.Fatalf("cluster node %s not ok: %v\n%s", addr, err, info)
			case <-time.After(20 * time.Millisecond):
			}
		}
		c.Close()
	}
	return nodes
}

// The conformance suite passes on a three-master Redis Cluster, with records
// spread over every master, through a client with ContextTimeoutEnabled and
// one without.
func TestCluster(t *testing.T) {
	t.Parallel()
	addrs := startCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(*testing.T) engine.Store { return s })
	// And through a client without ContextTimeoutEnabled, which the Store
	// calls node by node.
	t.Run("without ContextTimeoutEnabled", func(t *testing.T) {
		deaf := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { deaf.Close() })
		ds, err := redisstore.New(deaf, redisstore.WithPrefix("deaf:"))
		if err != nil {
			t.Fatal(err)
		}
		storetest.Run(t, func(*testing.T) engine.Store { return ds })
	})

	// Enough keys to land on every master, each taken through a claim and a
	// completion on its own node.
	ctx := context.Background()
	spread := func(scope string) {
		t.Helper()
		for i := range 64 {
			id := engine.ID{Scope: scope, Key: string(rune('A' + i))}
			cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil || cl.Status != engine.Acquired {
				t.Fatalf("Claim(%q) = %v, %v; want acquired", id, cl.Status, err)
			}
			if err := s.Complete(ctx, id, cl.Token, &engine.Response{Status: 200}, time.Hour); err != nil {
				t.Fatalf("Complete(%q) error = %v", id, err)
			}
		}
	}
	spread("spread")
	// Every master loses the functions; the next calls load them on every
	// master again.
	err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.FunctionFlush(ctx).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	spread("after-flush")
	err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		libs, err := m.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		if err == nil && len(libs) != 1 {
			err = fmt.Errorf("master %s holds %d libraries, want the store's", m.Options().Addr, len(libs))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	sizes := map[string]int64{}
	err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		sizes[m.Options().Addr] = n
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for addr, n := range sizes {
		if n == 0 {
			t.Errorf("master %s holds no records, want records on every master: %v", addr, sizes)
		}
	}
	if len(sizes) != len(addrs) {
		t.Errorf("cluster has %d masters, want %d", len(sizes), len(addrs))
	}
	stepsAcrossSlots(t, c)
	// Check reads every master: fine until one of them may evict.
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check on a cluster that does not evict = %v, want nil", err)
	}
	victim := addrs[1]
	admin := redis.NewClient(&redis.Options{Addr: victim, ContextTimeoutEnabled: true})
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "maxmemory", "1gb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, redisstore.ErrEviction) || !strings.Contains(err.Error(), victim) {
		t.Errorf("Check with master %s on volatile-lru = %v, want ErrEviction naming it", victim, err)
	}
}

// stepsAcrossSlots records, returns, looks up and drops steps through c,
// under prefixes and IDs whose braces decide the records' slots in every
// way: a function reaches the steps key only when it is in the record's
// slot ("Script attempted to access keys that do not hash to the same
// slot", otherwise).
func stepsAcrossSlots(t *testing.T, c *redis.ClusterClient) {
	t.Helper()
	ctx := context.Background()
	for _, prefix := range []string{"idempotency:", "{idem}:", "idem{", "idem{}:", ""} {
		s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range []engine.ID{
			{Key: "steps"}, {Scope: "{", Key: "}"}, {Scope: "a}", Key: "{b}"}, {Key: "{}x"}, {Scope: "t", Key: "}{"},
		} {
			id.Key += fmt.Sprint(i)
			fail := func(op string, err error) {
				t.Helper()
				t.Fatalf("prefix %q, ID %q: %s error = %v", prefix, id, op, err)
			}
			cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil || cl.Status != engine.Acquired {
				fail("Claim", err)
			}
			for _, st := range []engine.Step{{Name: "a", Fingerprint: "fa", Done: true, Result: []byte("1")}, {Name: "b", Fingerprint: "fb"}} {
				if err := s.SaveStep(ctx, id, cl.Token, st); err != nil {
					fail("SaveStep", err)
				}
			}
			if err := s.SaveStep(ctx, id, cl.Token, engine.Step{Name: "b"}); err != nil {
				fail("SaveStep (remove)", err)
			}
			if err := s.Extend(ctx, id, cl.Token, 2*time.Minute); err != nil {
				fail("Extend", err)
			}
			if err := s.Release(ctx, id, cl.Token); err != nil {
				fail("Release", err)
			}
			if cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour); err != nil || len(cl.Steps) != 1 {
				t.Fatalf("prefix %q, ID %q: Claim after Release = %d steps, %v; want 1", prefix, id, len(cl.Steps), err)
			}
			if r, err := s.Lookup(ctx, id); err != nil || len(r.Steps) != 1 {
				t.Fatalf("prefix %q, ID %q: Lookup = %d steps, %v; want 1", prefix, id, len(r.Steps), err)
			}
			if err := s.Complete(ctx, id, cl.Token, &engine.Response{Status: 200}, time.Hour); err != nil {
				fail("Complete", err)
			}
		}
	}
}
