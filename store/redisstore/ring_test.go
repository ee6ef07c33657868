package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
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
// completion and the replay behave as on a Client. Without
// ContextTimeoutEnabled, Open warns that each call runs on a goroutine of
// its own; with it, Open warns of nothing.
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
			warned := strings.Contains(logged.String(), "ContextTimeoutEnabled")
			assert.Equal(t, !timeouts, warned, "Open's warning of the client's timeouts; logged:\n%s", logged.String())

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
