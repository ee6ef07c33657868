package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/redisstore"
)

// startReplicated starts a master and a replica of it, and waits until the
// replica is in sync.
func startReplicated(t *testing.T) (master, replica *redisProcess) {
	t.Helper()
	needRedisServer(t)
	master = startRedis(t, "--repl-diskless-sync-delay", "0")
	replica = startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	awaitInSync(t, master, replica)
	return master, replica
}

// awaitInSync waits until replica is in sync with master, as both see it:
// the replica's link is up, and the master, whose view WAIT counts, has the
// replica online.
func awaitInSync(t *testing.T, master, replica *redisProcess) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: replica.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	defer mc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			var minfo string
			if minfo, err = mc.Info(context.Background(), "replication").Result(); err == nil && strings.Contains(minfo, "state=online") {
				return
			}
			info += minfo
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync after 10s: %v\n%s", err, info)
		}
		time.Sleep(10 * time.Millisecond) // polling the replication state, with a deadline
	}
}

// pause stops p with SIGSTOP, so that it answers nothing and acknowledges
// nothing, until resume; it is resumed when t ends.
func pause(t *testing.T, p *redisProcess) (resume func()) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
	var once sync.Once
	resume = func() { once.Do(func() { p.cmd.Process.Signal(syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// ackedServer serves POST / through the middleware on a Store of master
// WithReplicaAck(1, wait), under RefuseAbandoned, with a fixed scope and
// fingerprint, so that the test can claim its keys as another process
// would; the handler counts its runs. Its lease is lease, the default
// when 0.
func ackedServer(t *testing.T, master *redisProcess, wait, lease time.Duration) (url string, acked, plain redisstore.Store, runs *atomic.Int64) {
	t.Helper()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { mc.Close() })
	var err error
	acked, err = redisstore.New(mc, redisstore.WithReplicaAck(1, wait))
	require.NoError(t, err)
	plain, err = redisstore.New(mc)
	require.NoError(t, err)
	runs = new(atomic.Int64)
	mw, err := server.New(acked,
		server.WithConfig(engine.Config{Lease: lease, Abandoned: engine.RefuseAbandoned, Logger: slog.New(slog.DiscardHandler)}),
		server.WithScope(func(*http.Request) (string, error) { return "acme", nil }),
		server.WithFingerprint(func(*http.Request, []byte) (string, error) { return "order", nil }),
	)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, mw.Shutdown(ctx))
	})
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	return srv.URL, acked, plain, runs
}

// postOrder posts key and returns the status and the Idempotent-Outcome
// header of the answer.
func postOrder(t *testing.T, url, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(engine.HeaderOutcome)
}

// TestReplicaAckKeepsAbandoned: a takeover of a lost holder whose claim the
// replica does not acknowledge is released, and answered 503; the release
// must not erase the lost holder, so that, once the replica is back, the
// retry is answered "outcome unknown" under RefuseAbandoned, and the request
// does not run.
func TestReplicaAckKeepsAbandoned(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	url, _, plain, runs := ackedServer(t, master, 200*time.Millisecond, 0)
	// The holder, lost: its process died after its claim.
	c, err := plain.Claim(context.Background(), engine.ID{Scope: "acme", Key: "k"}, "order", 300*time.Millisecond, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)

	resume := pause(t, replica)
	deadline := time.Now().Add(10 * time.Second)
	status, outcome := postOrder(t, url, "k")
	for status == http.StatusConflict && outcome == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // a client's pause between retries, until the lease ends
		status, outcome = postOrder(t, url, "k")
	}
	require.Equal(t, http.StatusServiceUnavailable, status, "the takeover, not acknowledged")

	resume()
	awaitInSync(t, master, replica)
	// A client retries a 503: the replica, back, may still miss the first
	// acknowledgement's deadline on a busy machine.
	deadline = time.Now().Add(10 * time.Second)
	status, outcome = postOrder(t, url, "k")
	for status == http.StatusServiceUnavailable && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // a client's pause between retries
		status, outcome = postOrder(t, url, "k")
	}
	assert.Equal(t, http.StatusConflict, status)
	assert.Equal(t, "unknown", outcome, "the retry is answered \"outcome unknown\"")
	assert.Zero(t, runs.Load(), "the handler ran")
}

// TestReplicaAckWaitLongerThanClaim: WithReplicaAck's timeout is longer
// than the middleware's claim timeout (a lease of 2s makes it 1.8s), and
// the replica does not answer: the claim is answered 503 and the handler
// does not run. The claim that the master applied must not be left in
// flight unanswered: once the replica is back and the lease has passed,
// the retry runs the request, rather than being told of an abandoned
// holder ("outcome unknown") that never ran.
func TestReplicaAckWaitLongerThanClaim(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	const lease = 2 * time.Second
	url, _, plain, runs := ackedServer(t, master, 5*time.Second, lease)

	resume := pause(t, replica)
	status, _ := postOrder(t, url, "k")
	require.Equal(t, http.StatusServiceUnavailable, status, "a claim not acknowledged")
	require.Zero(t, runs.Load())
	resume()
	awaitInSync(t, master, replica)

	// Past the lease of the claim that was refused, however long its
	// answer took.
	end := time.Now().Add(lease)
	for time.Now().Before(end) {
		r, err := plain.Lookup(context.Background(), engine.ID{Scope: "acme", Key: "k"})
		if errors.Is(err, engine.ErrNotFound) {
			break // released: nothing to wait for
		}
		require.NoError(t, err)
		require.False(t, r.Completed)
		time.Sleep(20 * time.Millisecond) // polling until the lease passes
	}
	// A replica just resumed may be slow to acknowledge on a busy
	// machine: a 503 releases the claim again, and the client retries.
	status, outcome := postOrder(t, url, "k")
	for status == http.StatusServiceUnavailable && time.Now().Before(end.Add(10*time.Second)) {
		time.Sleep(50 * time.Millisecond) // a client's pause between retries
		status, outcome = postOrder(t, url, "k")
	}
	assert.Empty(t, outcome, "the retry is answered \"outcome unknown\"")
	assert.Equal(t, http.StatusCreated, status, "the retry runs")
	assert.Equal(t, int64(1), runs.Load(), "runs")
}

func TestReplicaAckOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tc := range []struct {
		replicas int
		timeout  time.Duration
		ok       bool
	}{
		{1, time.Nanosecond, true},
		{1, time.Duration(1<<63 - 1), true},
		{0, time.Second, false},
		{-1, time.Second, false},
		{1, 0, false},
	} {
		_, err := redisstore.New(c, redisstore.WithReplicaAck(tc.replicas, tc.timeout))
		if tc.ok {
			assert.NoError(t, err, "WithReplicaAck(%d, %v)", tc.replicas, tc.timeout)
		} else {
			assert.ErrorContains(t, err, "WithReplicaAck", "WithReplicaAck(%d, %v)", tc.replicas, tc.timeout)
		}
	}
}

// With a replica acknowledging, a claim and a completion are on the replica
// when they return; with the replica gone, the claim is released and fails,
// and the completion fails.
func TestReplicaAck(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { mc.Close() })
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rc.Close() })
	// Time enough for a busy machine's replica to acknowledge; the calls
	// after the replica is killed wait it out.
	s, err := redisstore.New(mc, redisstore.WithReplicaAck(1, 2*time.Second))
	require.NoError(t, err)
	ctx := context.Background()

	id := engine.ID{Key: "acked"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	onReplica := func() string {
		v, err := rc.Get(ctx, s.RecordKey(id)).Result()
		require.NoError(t, err, "the record on the replica")
		return v
	}
	assert.Equal(t, byte(1), onReplica()[1], "the replica's record is in flight")
	require.NoError(t, s.Complete(ctx, id, c.Token, &engine.Response{Status: http.StatusCreated}, time.Hour))
	assert.Equal(t, byte(2), onReplica()[1], "the replica's record is completed")
	// A replay wrote nothing and waits for nothing.
	got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, got.Status)

	// A claim taken before the replica went, completed after.
	early := engine.ID{Key: "early"}
	ec, err := s.Claim(ctx, early, "fp", time.Minute, time.Hour)
	require.NoError(t, err)

	replica.Kill()
	lone := engine.ID{Key: "alone"}
	_, err = s.Claim(ctx, lone, "fp", time.Minute, time.Hour)
	require.ErrorIs(t, err, redisstore.ErrNotReplicated)
	_, err = s.Lookup(ctx, lone)
	assert.ErrorIs(t, err, engine.ErrNotFound, "the unacknowledged claim is released")
	// So the next claim takes it, and fails the same way while alone.
	_, err = s.Claim(ctx, lone, "fp", time.Minute, time.Hour)
	assert.ErrorIs(t, err, redisstore.ErrNotReplicated)

	err = s.Complete(ctx, early, ec.Token, &engine.Response{Status: http.StatusCreated}, time.Hour)
	assert.ErrorIs(t, err, redisstore.ErrNotReplicated)
	assert.NotErrorIs(t, err, engine.ErrNotStorable)

	// Without the option, the same master answers.
	plain, err := redisstore.New(mc)
	require.NoError(t, err)
	c, err = plain.Claim(ctx, engine.ID{Key: "plain"}, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status)
}

// min-replicas-to-write, the server's companion: a master without the
// replicas it asks for refuses the claim, and the error is Redis's, not a
// corrupt record.
func TestMinReplicasToWrite(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t, "--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	require.NoError(t, err)
	_, err = s.Claim(context.Background(), engine.ID{Key: "alone"}, "fp", time.Minute, time.Hour)
	require.Error(t, err)
	assert.NotErrorIs(t, err, redisstore.ErrCorruptRecord)
	assert.Contains(t, err.Error(), "NOREPLICAS")
}

// WithReplicaAck, a step waits for the replica as a completion does, in
// the same round trip: acknowledged, it is on the replica, expiry and all;
// not acknowledged, it fails with ErrNotReplicated, which the engine tries
// again (not ErrNotStorable, not ErrLeaseLost), and the step is on the
// master. The claim that re-acquires a record with steps gets them through
// WAIT's round trip too.
func TestReplicaAckSteps(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { mc.Close() })
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rc.Close() })
	s, err := redisstore.New(mc, redisstore.WithReplicaAck(1, 2*time.Second))
	require.NoError(t, err)
	ctx := context.Background()
	id := engine.ID{Key: "steps"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)

	counter := &commandCounter{}
	mc.AddHook(counter)
	require.NoError(t, s.SaveStep(ctx, id, c.Token, doneStep("a", "1")))
	assert.Equal(t, []string{"fcall", "wait"}, counter.take(), "a step WithReplicaAck")
	steps, err := rc.HGetAll(ctx, redisstore.StepsKey(s, id)).Result()
	require.NoError(t, err)
	assert.Len(t, steps, 1, "the steps on the replica")
	assert.Equal(t, expiry(t, mc, redisstore.StepsKey(s, id)), expiry(t, rc, redisstore.StepsKey(s, id)), "the steps key's expiry on the replica")
	assert.Equal(t, expiry(t, mc, s.RecordKey(id)), expiry(t, rc, redisstore.StepsKey(s, id)), "the record's expiry, the steps key's on the replica")

	require.NoError(t, s.Release(ctx, id, c.Token))
	c, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	assert.Len(t, c.Steps, 1, "the steps of a claim WithReplicaAck")

	impatient, err := redisstore.New(mc, redisstore.WithReplicaAck(1, 50*time.Millisecond))
	require.NoError(t, err)
	resume := pause(t, replica)
	for range 2 {
		err = impatient.SaveStep(ctx, id, c.Token, doneStep("b", "2"))
		assert.ErrorIs(t, err, redisstore.ErrNotReplicated, "a step the replica did not acknowledge")
		assert.NotErrorIs(t, err, engine.ErrNotStorable)
		assert.NotErrorIs(t, err, engine.ErrLeaseLost)
	}
	plain, err := redisstore.New(mc)
	require.NoError(t, err)
	r, err := plain.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Len(t, r.Steps, 2, "the steps on the master")
	resume()
	awaitInSync(t, master, replica)
	require.NoError(t, s.SaveStep(ctx, id, c.Token, doneStep("b", "2")), "the step tried again, the replica back")
	steps, err = rc.HGetAll(ctx, redisstore.StepsKey(s, id)).Result()
	require.NoError(t, err)
	assert.Len(t, steps, 2, "the steps on the replica")
}
