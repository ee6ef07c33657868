package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
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

// TestRedisClusterFailover runs orders through the middleware on a Redis
// Cluster of three masters, each with a replica, kills one master with
// SIGKILL mid-run, and lets its replica be promoted while the client keeps
// retrying. Replication is asynchronous, so what the master had acknowledged
// and not yet sent to its replica is gone: the test counts the records lost
// and the orders that ran a second time because of it, after sending every
// order once more.
//
// It checks what the store does guarantee: orders on the other masters, and
// orders on the failed master that were answered longer before the kill than
// the replication lag, ran once and kept their records; every order ran
// again only if it was on the failed master. With a replication lag (a proxy
// that holds the master's stream to its replica), it checks that records
// were lost indeed.
func TestRedisClusterFailover(t *testing.T) {
	cases := []failoverCase{
		{name: "kill", reload: time.Second, orders: 600},
		{name: "kill with 100ms replication lag", lag: 100 * time.Millisecond, reload: time.Second, orders: 600},
		// The replica acknowledges every claim and completion (WAIT)
		// before the handler runs and before the answer.
		{name: "kill with 100ms replication lag, replica ack", lag: 100 * time.Millisecond, reload: time.Second, orders: 300, ack: time.Second},
	}
	if *failoverLong {
		cases = []failoverCase{
			{name: "kill", reload: time.Second, orders: 5000},
			{name: "kill with 100ms replication lag", lag: 100 * time.Millisecond, reload: time.Second, orders: 5000},
			{name: "kill with 10ms replication lag", lag: 10 * time.Millisecond, reload: time.Second, orders: 5000},
			{name: "kill with 100ms replication lag, replica ack", lag: 100 * time.Millisecond, reload: time.Second, orders: 5000, ack: time.Second},
			{name: "kill with 10ms replication lag, replica ack", lag: 10 * time.Millisecond, reload: time.Second, orders: 5000, ack: time.Second},
			// go-redis's own slot-map reload comes once a minute: the
			// store asks for one when a node stops answering. Not in
			// CI, whose time it would take a minute of: the case waits
			// for go-redis, at the size CI once ran it.
			{name: "kill, go-redis's default reload interval", orders: 600},
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			// WAIT needs a replica after the failover too: the failed
			// master gets a second one, which replicates from the
			// promoted one.
			cl := startFailoverCluster(t, tc.lag, tc.ack > 0)
			t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
			res := runFailover(t, cl, tc, tc.orders)
			t.Logf("%s", res)
			assert.Zero(t, res.failures, "orders never answered")
			assert.Zero(t, res.survivorsDuplicated, "orders on the surviving masters run twice")
			assert.Zero(t, res.survivorsLost, "records lost on the surviving masters")
			assert.Zero(t, res.oldLost, "records lost that were answered long before the kill")
			assert.Zero(t, res.newLost, "records lost of orders first sent after the kill")
			assert.Equal(t, res.duplicated, res.failedDuplicated, "orders run twice that were not on the failed master")
			switch {
			case tc.ack > 0:
				assert.Zero(t, res.duplicated, "orders run twice with the replica's acknowledgement")
				assert.Zero(t, res.lost, "records lost with the replica's acknowledgement")
			case tc.lag > 0:
				assert.Positive(t, res.lost+res.reverted, "the lag lost no record: the test shows nothing")
			}
		})
	}
}

var failoverLong = flag.Bool("failover.long", false, "fail over after thousands of orders, with a short lag too, and with go-redis's default reload interval, for the figures")

// failoverCase is one way of failing over.
type failoverCase struct {
	name string
	// lag holds the failed master's replication stream this long.
	lag time.Duration
	// reload is the Cluster client's ClusterStateReloadInterval; 0 keeps
	// go-redis's default, 60 seconds. A connection refused by a dead master
	// does not make go-redis reload its slot map, so until it does, the
	// failed master's slots stay unreachable whatever the failover.
	reload time.Duration
	// orders are answered before the kill, and as many again after the
	// failover.
	orders int
	// ack, when set, makes the store wait for the replica's
	// acknowledgement of each claim and completion, this long at most
	// (redisstore.WithReplicaAck(1, ack)).
	ack time.Duration
}

// failoverCluster is a Redis Cluster of three masters and three replicas
// that a test started. The first master is the one the test kills.
type failoverCluster struct {
	masters, replicas []*failoverNode
	// lag is the proxy between the first master and its replica, if any.
	lag *lagProxy
	// route maps an address that a master announces to the one it listens
	// on, for the application's connections.
	route map[string]string
}

// slotsOf is the slot range each master gets.
var slotsOf = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

func startFailoverCluster(t *testing.T, lag time.Duration, secondReplica bool) *failoverCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := fmt.Sprintf("this test starts a Redis Cluster of its own and needs redis-server: %v", err)
		if servicetest.Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cl := &failoverCluster{route: map[string]string{}}
	for i := range 3 {
		var extra []string
		port := servicetest.FreeRedisPort(t)
		if i == 0 && lag > 0 {
			// The replica reaches this master through the proxy, at
			// the address the master announces; the application dials
			// the master directly.
			cl.lag = startLagProxy(t, "127.0.0.1:"+strconv.Itoa(port), lag)
			extra = []string{"--cluster-announce-port", strconv.Itoa(cl.lag.port),
				"--cluster-announce-bus-port", strconv.Itoa(port + 10000)}
			cl.route[cl.lag.addr] = "127.0.0.1:" + strconv.Itoa(port)
		}
		cl.masters = append(cl.masters, startFailoverNode(t, port, extra...))
	}
	replicas := 3
	if secondReplica {
		replicas = 4
	}
	for range replicas {
		cl.replicas = append(cl.replicas, startFailoverNode(t, servicetest.FreeRedisPort(t)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := append(slices.Clone(cl.masters), cl.replicas...)
	for i, m := range cl.masters {
		require.NoError(t, m.c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err())
		require.NoError(t, m.c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", slotsOf[i][0], slotsOf[i][1]).Err())
	}
	for _, n := range all[1:] {
		require.NoError(t, all[0].c.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.port)).Err())
	}
	waitCluster(t, ctx, "every node to know the others", all, func(n *failoverNode) bool {
		nodes, err := n.c.ClusterNodes(ctx).Result()
		return err == nil && strings.Count(nodes, "\n") == len(all) && !strings.Contains(nodes, "handshake")
	})
	for i, r := range cl.replicas {
		require.NoError(t, r.c.ClusterReplicate(ctx, cl.masters[i%3].id).Err())
	}
	waitCluster(t, ctx, "the replicas to be in sync and known as such", all, func(n *failoverNode) bool {
		nodes, err := n.c.ClusterNodes(ctx).Result()
		info, err2 := n.c.ClusterInfo(ctx).Result()
		if err != nil || err2 != nil || strings.Count(nodes, "slave") != len(cl.replicas) || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
		if slices.Contains(cl.replicas, n) {
			repl, err := n.c.Info(ctx, "replication").Result()
			return err == nil && strings.Contains(repl, "master_link_status:up")
		}
		return true
	})
	return cl
}

// waitCluster polls ready on every node until it holds for all, for at most
// the context's deadline.
func waitCluster(t *testing.T, ctx context.Context, what string, nodes []*failoverNode, ready func(*failoverNode) bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		for _, n := range nodes {
			if !ready(n) {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// client returns a Cluster client whose connections to a master that
// announces the proxy's address go to the master itself.
func (cl *failoverCluster) client(t *testing.T, reload time.Duration) *redis.ClusterClient {
	var addrs []string
	for _, m := range cl.masters {
		addrs = append(addrs, m.addr)
	}
	// Runs after the client is closed: go-redis keeps trying to dial the
	// dead master in the background for up to a second after Close.
	t.Cleanup(func() { failoverWaitDialers(t) })
	var d net.Dialer
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      addrs,
		ContextTimeoutEnabled:      true,
		PoolSize:                   32,
		ClusterStateReloadInterval: reload,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if real, ok := cl.route[addr]; ok {
				addr = real
			}
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// failoverWaitDialers waits, for at most five seconds, until no go-redis
// pool is still trying to dial a server in the background.
func failoverWaitDialers(t *testing.T) {
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !strings.Contains(string(buf[:n]), "(*ConnPool).tryDial") {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("go-redis still dials in the background five seconds after Close")
			return
		}
		time.Sleep(50 * time.Millisecond) // a poll interval
	}
}

// failoverResult is what a run counted.
type failoverResult struct {
	orders, executions                   int
	duplicated, failedDuplicated         int
	survivorsDuplicated                  int
	lost, reverted                       int // records gone, records back in flight
	survivorsLost, oldLost, newLost      int
	unstored                             int // responses sent whose Complete failed
	onFailed, answeredInWindow, failures int
	failover                             time.Duration
	answers                              string
}

func (r failoverResult) String() string {
	return fmt.Sprintf("%d orders (%d on the failed master, %d of them answered within a second before the kill); "+
		"failover took %v; %d executions; %d orders run twice or more (%d on the failed master); "+
		"after the failover %d answered orders had no record and %d were back in flight; %d responses sent whose Complete failed; answers seen: %s",
		r.orders, r.onFailed, r.answeredInWindow, r.failover.Round(10*time.Millisecond), r.executions, r.duplicated,
		r.failedDuplicated, r.lost, r.reverted, r.unstored, r.answers)
}

// runFailover sends orders until before of them are answered, kills the
// first master, sends orders until the cluster has failed over and as many
// again are answered, then checks every order's record and sends each once
// more.
func runFailover(t *testing.T, cl *failoverCluster, tc failoverCase, before int) failoverResult {
	ctx := context.Background()
	rc := cl.client(t, tc.reload)
	prefix := "idempotency-failover:"
	opts := []redisstore.Option{redisstore.WithPrefix(prefix)}
	if tc.ack > 0 {
		opts = append(opts, redisstore.WithReplicaAck(1, tc.ack))
	}
	store, err := redisstore.New(rc, opts...)
	require.NoError(t, err)
	svc := newFailoverOrders()
	var logs failoverLog
	logs.b = &strings.Builder{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("middleware log (first 64 KiB):\n%s", logs.String())
		}
	})
	// A lease longer than the failover, shorter than the default so that
	// a record whose completion was lost is taken over within the test.
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
		idempotency.WithoutBudget(),
	)
	hc := client.StandardClient()
	url := srv.URL + "/orders"

	var (
		mu       sync.Mutex
		answered = map[int]time.Time{} // when each order was answered
		started  = map[int]time.Time{} // and first sent
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
				sent := time.Now()
				if _, err := failoverSubmit(hc, url, i); err != nil {
					if failures.Add(1) <= 3 {
						t.Logf("order %d: %v", i, err)
					}
					continue
				}
				mu.Lock()
				answered[i] = time.Now()
				started[i] = sent
				mu.Unlock()
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(answered)
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("waiting for %s", what)
			}
			<-tick.C
		}
	}
	waitFor("the orders before the kill", time.Minute, func() bool { return count() >= before })

	t.Logf("%d orders answered before the kill", count())
	killed := time.Now()
	cl.masters[0].kill()
	if cl.lag != nil {
		cl.lag.close()
	}
	candidates := []*failoverNode{cl.replicas[0]}
	if len(cl.replicas) > 3 {
		candidates = append(candidates, cl.replicas[3])
	}
	waitFor("the replica's promotion", time.Minute, func() bool {
		for _, promoted := range candidates {
			info, err := promoted.c.Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "role:master") {
				continue
			}
			ci, err := promoted.c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(ci, "cluster_state:ok") {
				return true
			}
		}
		return false
	})
	res := failoverResult{failover: time.Since(killed)}
	waitFor("the orders after the failover", time.Minute, func() bool { return count() >= 2*before })
	stop.Store(true)
	wg.Wait()
	res.failures = int(failures.Load())

	t.Logf("%d orders answered %v after the kill", count(), time.Since(killed).Round(time.Millisecond))
	// Which records survived, before anything is sent again.
	slotCheck, err := rc.ClusterKeySlot(ctx, store.RecordKey(engine.ID{Key: "key-fo-0"})).Result()
	require.NoError(t, err)
	require.Equal(t, int64(failoverSlot(store.RecordKey(engine.ID{Key: "key-fo-0"}))), slotCheck, "the test's slot of a key")
	onFailed := map[int]bool{}
	for i, at := range answered {
		key := store.RecordKey(engine.ID{Key: "key-fo-" + strconv.Itoa(i)})
		slot := failoverSlot(key)
		failed := slot <= slotsOf[0][1]
		onFailed[i] = failed
		if failed {
			res.onFailed++
			if d := killed.Sub(at); d >= 0 && d < time.Second {
				res.answeredInWindow++
			}
		}
		n, err := rc.Exists(ctx, key).Result()
		require.NoError(t, err)
		if n == 0 {
			res.lost++
			switch {
			case !failed:
				res.survivorsLost++
			case killed.Sub(at) > time.Second:
				res.oldLost++
			case started[i].After(killed):
				res.newLost++
			}
		}
	}
	// Every order once more: a replay, unless its record was lost.
	before2 := svc.total()
	again := make(chan int)
	errs := make(chan error, len(answered))
	var senders sync.WaitGroup
	for range 16 {
		senders.Go(func() {
			for i := range again {
				if _, err := failoverSubmit(hc, url, i); err != nil {
					errs <- fmt.Errorf("order %d sent again: %w", i, err)
				}
			}
		})
	}
	for i := range answered {
		again <- i
	}
	close(again)
	senders.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("every order sent again %v after the kill", time.Since(killed).Round(time.Millisecond))
	res.orders = len(answered)
	res.reverted = svc.total() - before2 - res.lost
	for ref, n := range svc.snapshot() {
		res.executions += n
		if n > 1 {
			res.duplicated++
			i, _ := strconv.Atoi(strings.TrimPrefix(ref, "fo-"))
			if onFailed[i] {
				res.failedDuplicated++
			} else {
				res.survivorsDuplicated++
			}
		}
	}
	res.answers = counts.String()
	res.unstored = strings.Count(logs.String(), "idempotent response not stored")
	return res
}

// failoverSubmit sends order i, with its key, and returns the answer's body.
func failoverSubmit(hc *http.Client, url string, i int) (string, error) {
	ref := "fo-" + strconv.Itoa(i)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"ref":"`+ref+`"}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", "key-"+ref)
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return string(b), nil
}

// failoverOrders counts the executions of every order.
type failoverOrders struct {
	mu         sync.Mutex
	executions map[string]int
}

func newFailoverOrders() *failoverOrders { return &failoverOrders{executions: map[string]int{}} }

func (s *failoverOrders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in struct{ Ref string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Ref == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	// A handler takes a while: claims are in flight when the master dies.
	time.Sleep(2 * time.Millisecond)
	s.mu.Lock()
	s.executions[in.Ref]++
	n := s.executions[in.Ref]
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"ref":%q,"execution":%d}`, in.Ref, n)
}

func (s *failoverOrders) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.executions {
		n += v
	}
	return n
}

func (s *failoverOrders) snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.executions))
	for k, v := range s.executions {
		out[k] = v
	}
	return out
}

// failoverAnswers counts what the client saw on each attempt.
type failoverAnswers struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *failoverAnswers) add(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[what]++
}

func (c *failoverAnswers) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for k, v := range c.n {
		parts = append(parts, k+" "+strconv.Itoa(v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

type failoverCounting struct {
	next  http.RoundTripper
	count *failoverAnswers
}

func (c *failoverCounting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		c.count.add("error")
		return resp, err
	}
	c.count.add(strconv.Itoa(resp.StatusCode))
	return resp, err
}

// failoverSlot is the Cluster slot of key: CRC16 (XMODEM) of the key, or of
// its hash tag, modulo 16384.
func failoverSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// failoverNode is a redis-server in cluster mode that the test started.
type failoverNode struct {
	addr   string
	port   int
	id     string
	c      *redis.Client
	cmd    *exec.Cmd
	exited chan struct{}
}

func startFailoverNode(t *testing.T, port int, extra ...string) *failoverNode {
	t.Helper()
	n := startRedisNode(t, port, append([]string{"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"}, extra...)...)
	id, err := n.c.Do(context.Background(), "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	n.id = id
	return n
}

// startRedisNode starts redis-server on port with args, waits until it
// answers, and kills it when t ends.
func startRedisNode(t *testing.T, port int, extra ...string) *failoverNode {
	t.Helper()
	n := &failoverNode{addr: "127.0.0.1:" + strconv.Itoa(port), port: port, exited: make(chan struct{})}
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", t.TempDir(),
		// A replica syncs at once, not after the default 5 s of waiting
		// for others.
		"--repl-diskless-sync-delay", "0",
	}, extra...)
	return startRedisCommand(t, n, args...)
}

// startRedisCommand runs redis-server with args for n, and waits until it
// answers PING.
func startRedisCommand(t *testing.T, n *failoverNode, args ...string) *failoverNode {
	t.Helper()
	port := n.port
	n.cmd = exec.Command("redis-server", args...)
	out := &failoverLog{b: &strings.Builder{}}
	n.cmd.Stdout, n.cmd.Stderr = out, out
	require.NoError(t, n.cmd.Start())
	go func() {
		n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(n.kill)
	deadline := time.Now().Add(10 * time.Second)
	for failoverPing(n.addr) != nil {
		select {
		case <-n.exited:
			t.Fatalf("redis-server on port %d exited: %s", port, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "redis-server on port %d does not answer", port)
	}
	n.c = redis.NewClient(&redis.Options{Addr: n.addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { n.c.Close() })
	return n
}

// kill kills the server with SIGKILL and waits for it to exit.
func (n *failoverNode) kill() {
	n.cmd.Process.Kill()
	<-n.exited
}

type failoverLog struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (l *failoverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *failoverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<16 {
		l.b.Write(p)
	}
	return len(p), nil
}

// failoverPing sends PING to addr over a connection of its own.
func failoverPing(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return errors.New("PING answered " + strconv.Quote(line))
	}
	return nil
}

// lagProxy forwards connections to a Redis master, holding what the master
// sends for a fixed time before passing it on: the replication lag of a
// replica far away, or busy. close drops what it holds.
type lagProxy struct {
	addr     string
	port     int
	upstream string
	lag      time.Duration
	ln       net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	closed   bool
	wg       sync.WaitGroup
}

func startLagProxy(t *testing.T, upstream string, lag time.Duration) *lagProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &lagProxy{addr: ln.Addr().String(), port: ln.Addr().(*net.TCPAddr).Port, upstream: upstream, lag: lag, ln: ln}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *lagProxy) accept() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			up.Close()
			down.Close()
			return
		}
		p.conns = append(p.conns, up, down)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(up, down) })
		p.wg.Go(func() { p.delayed(down, up) })
	}
}

// delayed copies from src to dst, each chunk lag after it was read.
func (p *lagProxy) delayed(dst, src net.Conn) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	queue := make(chan chunk, 1<<16)
	p.wg.Go(func() {
		for c := range queue {
			time.Sleep(time.Until(c.at)) // the lag itself
			if _, err := dst.Write(c.data); err != nil {
				for range queue {
				}
				return
			}
		}
	})
	defer close(queue)
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			queue <- chunk{at: time.Now().Add(p.lag), data: buf[:n]}
		}
		if err != nil {
			return
		}
	}
}

// close stops the proxy and cuts its connections, dropping what it holds.
func (p *lagProxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
