package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// A Ring client works as any other: Open loads nothing up front, the first
// call loads the library on the shard that owns the key, and a claim, its
// completion and the replay behave as on a Client; with
// ContextTimeoutEnabled or without, Open warns of nothing (without it, the
// Store calls the shard through a clone that has it).
func TestRing(t *testing.T) {
	t.Parallel()
	for _, timeouts := range []bool{true, false} {
		name := "ContextTimeoutEnabled"
		if !timeouts {
			name = "without ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opt := sharedOptions(t)
			ring := redis.NewRing(&redis.RingOptions{
				Addrs:                 map[string]string{"one": opt.Addr},
				Username:              opt.Username,
				Password:              opt.Password,
				DB:                    opt.DB,
				ContextTimeoutEnabled: timeouts,
			})
			t.Cleanup(func() { ring.Close() })
			var logged bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := redisstore.Open(ctx, ring, redisstore.WithPrefix(testPrefix(t, sharedClient(t))), redisstore.WithLogger(logger))
			require.NoError(t, err)
			assert.Empty(t, logged.String(), "Open's warnings")

			id := engine.ID{Scope: "ring", Key: "k"}
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
			require.NoError(t, s.Complete(ctx, id, c.Token, &engine.Response{Status: 201, Body: []byte("done")}, time.Hour))
			replay, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Completed, replay.Status)
			assert.Equal(t, "done", string(replay.Response.Body))
		})
	}
}

// On a Ring of two shards, each record and its steps are on the shard
// that owns the record's key, whichever shard the steps key's own name
// would go to: a step saved, released and resumed by the next claim, and
// found by Lookup, for keys on both shards; through a client with
// ContextTimeoutEnabled and one without (the Store then calls each shard
// through a clone of its client).
func TestRingSteps(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	for _, timeouts := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", timeouts), func(t *testing.T) {
			t.Parallel()
			ringSteps(t, timeouts)
		})
	}
}

func ringSteps(t *testing.T, timeouts bool) {
	a, b := startRedis(t), startRedis(t)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:                 map[string]string{"a": a.Addr, "b": b.Addr},
		ContextTimeoutEnabled: timeouts,
	})
	t.Cleanup(func() { ring.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := redisstore.New(ring)
	require.NoError(t, err)
	const keys = 24
	for i := range keys {
		id := engine.ID{Scope: "ring", Key: "order-" + strconv.Itoa(i)}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status, "%v", id)
		require.NoError(t, s.SaveStep(ctx, id, c.Token, doneStep("charge", "ch_"+strconv.Itoa(i))))
		require.NoError(t, s.Release(ctx, id, c.Token))
		again, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, again.Status, "%v, after its release", id)
		require.Len(t, again.Steps, 1, "%v: the steps the release kept", id)
		assert.Equal(t, "charge", again.Steps[0].Name)
		assert.Equal(t, "ch_"+strconv.Itoa(i), string(again.Steps[0].Result))
		rec, err := s.Lookup(ctx, id)
		require.NoError(t, err)
		assert.Len(t, rec.Steps, 1, "%v: Lookup's steps", id)
		require.NoError(t, s.Complete(ctx, id, again.Token, &engine.Response{Status: 201}, time.Hour))
	}
	// Both shards hold records, and no steps key is left: a completion
	// deletes its record's steps key, on the record's shard.
	total := 0
	for _, p := range []*redisProcess{a, b} {
		c := redis.NewClient(&redis.Options{Addr: p.Addr})
		n, err := c.DBSize(ctx).Result()
		c.Close()
		require.NoError(t, err)
		assert.Greater(t, n, int64(0), "records on the shard at %s", p.Addr)
		total += int(n)
	}
	assert.Equal(t, keys, total, "keys left on the two shards: one record a key, no steps key")
}
