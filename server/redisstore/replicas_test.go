package redisstore_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/redisstore"
)

// startReplicated starts a master and a replica of it, and waits until the
// replica is in sync.
func startReplicated(t *testing.T) (master, replica *redisProcess) {
	t.Helper()
	needRedisServer(t)
	master = startRedis(t, "--repl-diskless-sync-delay", "0")
	replica = startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	c := redis.NewClient(&redis.Options{Addr: replica.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	defer mc.Close()
	// In sync as both see it: the replica's link is up, and the master,
	// whose view WAIT counts, has the replica online.
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			var minfo string
			if minfo, err = mc.Info(context.Background(), "replication").Result(); err == nil && strings.Contains(minfo, "state=online") {
				return master, replica
			}
			info += minfo
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync after 10s: %v\n%s", err, info)
		}
		time.Sleep(10 * time.Millisecond) // polling the replication state, with a deadline
	}
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

	id := server.ID{Key: "acked"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, server.Acquired, c.Status)
	onReplica := func() string {
		v, err := rc.Get(ctx, s.RecordKey(id)).Result()
		require.NoError(t, err, "the record on the replica")
		return v
	}
	assert.Equal(t, byte(1), onReplica()[1], "the replica's record is in flight")
	require.NoError(t, s.Complete(ctx, id, c.Token, &server.Response{Status: http.StatusCreated}, time.Hour))
	assert.Equal(t, byte(2), onReplica()[1], "the replica's record is completed")
	// A replay wrote nothing and waits for nothing.
	got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, server.Completed, got.Status)

	// A claim taken before the replica went, completed after.
	early := server.ID{Key: "early"}
	ec, err := s.Claim(ctx, early, "fp", time.Minute, time.Hour)
	require.NoError(t, err)

	replica.Kill()
	lone := server.ID{Key: "alone"}
	_, err = s.Claim(ctx, lone, "fp", time.Minute, time.Hour)
	require.ErrorIs(t, err, redisstore.ErrNotReplicated)
	_, err = s.Lookup(ctx, lone)
	assert.ErrorIs(t, err, server.ErrNotFound, "the unacknowledged claim is released")
	// So the next claim takes it, and fails the same way while alone.
	_, err = s.Claim(ctx, lone, "fp", time.Minute, time.Hour)
	assert.ErrorIs(t, err, redisstore.ErrNotReplicated)

	err = s.Complete(ctx, early, ec.Token, &server.Response{Status: http.StatusCreated}, time.Hour)
	assert.ErrorIs(t, err, redisstore.ErrNotReplicated)
	assert.NotErrorIs(t, err, server.ErrNotStorable)

	// Without the option, the same master answers.
	plain, err := redisstore.New(mc)
	require.NoError(t, err)
	c, err = plain.Claim(ctx, server.ID{Key: "plain"}, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, server.Acquired, c.Status)
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
	_, err = s.Claim(context.Background(), server.ID{Key: "alone"}, "fp", time.Minute, time.Hour)
	require.Error(t, err)
	assert.NotErrorIs(t, err, redisstore.ErrCorruptRecord)
	assert.Contains(t, err.Error(), "NOREPLICAS")
}
