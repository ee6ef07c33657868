package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/redisstore"
)

// TestRedisSentinelSwitchover runs orders through the middleware on a
// master, a replica in sync and a Sentinel, and has the Sentinel switch the
// two over (SENTINEL FAILOVER) mid-run. The old master accepts writes from
// clients still aimed at it after the replica is promoted, until the
// Sentinel turns it into a replica, which discards them: those claims and
// completions are lost, and a retry runs the order again. With the replica
// acknowledgement (redisstore.WithReplicaAck) a claim that no replica has is
// released and answered 503, so nothing runs twice, through a client with
// ContextTimeoutEnabled or without it.
func TestRedisSentinelSwitchover(t *testing.T) {
	orders := 300
	if *failoverLong {
		orders = 3000
	}
	for _, tc := range []struct {
		name string
		ack  time.Duration
		// deaf gives the client no ContextTimeoutEnabled: the Store calls
		// it through a clone that has it, which shares its connections.
		deaf bool
	}{
		{"switchover", 0, false},
		{"switchover, replica ack", time.Second, false},
		{"switchover, replica ack, client without ContextTimeoutEnabled", time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runSwitchover(t, startSentinelPair(t), tc.ack, !tc.deaf, orders)
			t.Logf("%d orders; the old master was a replica in sync %v after SENTINEL FAILOVER; %d executions; "+
				"%d orders run twice or more; %d answered orders had no record on the new master and %d were back in flight; "+
				"%d responses sent whose Complete failed; answers seen: %s",
				res.orders, res.failover.Round(10*time.Millisecond), res.executions, res.duplicated, res.lost, res.reverted,
				res.unstored, res.answers)
			assert.Zero(t, res.failures, "orders never answered")
			if tc.ack > 0 {
				assert.Zero(t, res.duplicated, "orders run twice with the replica's acknowledgement")
				assert.Zero(t, res.lost, "records lost with the replica's acknowledgement")
			}
		})
	}
}

// sentinelPair is a master, its replica and one Sentinel (quorum 1).
type sentinelPair struct {
	master, replica, sentinel *failoverNode
}

const sentinelMaster = "idempotency"

func startSentinelPair(t *testing.T) *sentinelPair {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := fmt.Sprintf("this test starts Redis and a Sentinel of its own and needs redis-server: %v", err)
		if servicetest.Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	p := &sentinelPair{}
	p.master = startRedisNode(t, servicetest.FreeRedisPort(t))
	p.replica = startRedisNode(t, servicetest.FreeRedisPort(t), "--replicaof", "127.0.0.1", strconv.Itoa(p.master.port))
	port := servicetest.FreeRedisPort(t)
	dir := t.TempDir()
	conf := dir + "/sentinel.conf"
	require.NoError(t, writeFile(conf, fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %[3]s 1000\n"+
		"sentinel failover-timeout %[3]s 10000\n", port, dir, sentinelMaster, p.master.port)))
	p.sentinel = &failoverNode{addr: "127.0.0.1:" + strconv.Itoa(port), port: port, exited: make(chan struct{})}
	startRedisCommand(t, p.sentinel, conf, "--sentinel")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitCluster(t, ctx, "the Sentinel to know the replica in sync", []*failoverNode{p.sentinel}, func(n *failoverNode) bool {
		reps, err := n.c.Do(ctx, "SENTINEL", "REPLICAS", sentinelMaster).Slice()
		if err != nil || len(reps) != 1 {
			return false
		}
		info, err := p.replica.c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up") && !strings.Contains(fmt.Sprint(reps), "disconnected")
	})
	return p
}

func writeFile(name, content string) error {
	return os.WriteFile(name, []byte(content), 0o600)
}

// runSwitchover sends orders until before of them are answered, has the
// Sentinel switch master and replica over, sends orders until as many
// again are answered after the switch, then checks every order's record on
// the new master and sends each once more.
func runSwitchover(t *testing.T, p *sentinelPair, ack time.Duration, timeouts bool, before int) failoverResult {
	ctx := context.Background()
	t.Cleanup(func() { failoverWaitDialers(t) })
	rc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            sentinelMaster,
		SentinelAddrs:         []string{p.sentinel.addr},
		ContextTimeoutEnabled: timeouts,
		PoolSize:              32,
	})
	t.Cleanup(func() { rc.Close() })
	opts := []redisstore.Option{redisstore.WithPrefix("idempotency-switchover:")}
	if ack > 0 {
		opts = append(opts, redisstore.WithReplicaAck(1, ack))
	}
	store, err := redisstore.New(rc, opts...)
	require.NoError(t, err)
	svc := newFailoverOrders()
	var logs failoverLog
	logs.b = &strings.Builder{}
	mw, err := server.New(store, server.WithConfig(engine.Config{Lease: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	require.NoError(t, err)
	srv := startServer(t, mw.Handler(svc))
	counts := &failoverAnswers{}
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	client := clienttest.New(t,
		idempotency.WithHTTPClient(&http.Client{Transport: &failoverCounting{next: tr, count: counts}}),
		idempotency.WithAttemptTimeout(5*time.Second),
		idempotency.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		idempotency.WithMaxAttempts(50),
		idempotency.WithMaxRetryAfter(2*time.Second),
		idempotency.WithBudget(nil),
	)
	hc := client.StandardClient()
	url := srv.URL + "/orders"

	var (
		mu       sync.Mutex
		answered = map[int]bool{}
		stop     atomic.Bool
		failures atomic.Int64
		wg       sync.WaitGroup
	)
	refs := make(chan int)
	wg.Go(func() {
		defer close(refs)
		for i := 0; !stop.Load(); i++ {
			refs <- i
		}
	})
	for range 16 {
		wg.Go(func() {
			for i := range refs {
				if _, err := failoverSubmit(hc, url, i); err != nil {
					if failures.Add(1) <= 3 {
						t.Logf("order %d: %v", i, err)
					}
					continue
				}
				mu.Lock()
				answered[i] = true
				mu.Unlock()
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(answered)
	}
	waitFor := func(what string, cond func() bool) {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("waiting for %s; middleware log:\n%s", what, logs.String())
			}
			<-tick.C
		}
	}
	waitFor("the orders before the switchover", func() bool { return count() >= before })
	switched := time.Now()
	require.NoError(t, p.sentinel.c.Do(ctx, "SENTINEL", "FAILOVER", sentinelMaster).Err())
	waitFor("the old master to be a replica in sync", func() bool {
		info, err := p.master.c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")
	})
	res := failoverResult{failover: time.Since(switched)}
	at := count()
	waitFor("the orders after the switchover", func() bool { return count() >= at+before })
	stop.Store(true)
	wg.Wait()
	res.failures = int(failures.Load())

	for i := range answered {
		n, err := p.replica.c.Exists(ctx, store.RecordKey(engine.ID{Key: "key-fo-" + strconv.Itoa(i)})).Result()
		require.NoError(t, err)
		if n == 0 {
			res.lost++
		}
	}
	before2 := svc.total()
	again := make(chan int)
	var senders sync.WaitGroup
	for range 16 {
		senders.Go(func() {
			for i := range again {
				if _, err := failoverSubmit(hc, url, i); err != nil {
					t.Errorf("order %d sent again: %v", i, err)
				}
			}
		})
	}
	for i := range answered {
		again <- i
	}
	close(again)
	senders.Wait()
	res.orders = len(answered)
	res.reverted = svc.total() - before2 - res.lost
	for _, n := range svc.snapshot() {
		res.executions += n
		if n > 1 {
			res.duplicated++
		}
	}
	res.answers = counts.String()
	res.unstored = strings.Count(logs.String(), "idempotent response not stored")
	return res
}
