package redisstore_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// A response larger than the server accepts in one argument
// (proto-max-bulk-len) is refused every time: Complete says so with
// engine.ErrNotStorable, and the lease is still held, so that the middleware
// can record the request as done without the body.
func TestCompleteNotStorable(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t, "--proto-max-bulk-len", "1mb")
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	require.NoError(t, err)
	ctx := context.Background()
	id := engine.ID{Key: "large"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)

	large := &engine.Response{Status: http.StatusCreated, Body: bytes.Repeat([]byte("x"), 1536<<10)}
	err = s.Complete(ctx, id, cl.Token, large, time.Hour)
	require.Error(t, err)
	assert.ErrorIs(t, err, engine.ErrNotStorable)
	// Nothing was written, and the lease holds: the record without its body
	// is stored by the same holder.
	omitted := &engine.Response{Status: http.StatusCreated, BodyOmitted: true}
	require.NoError(t, s.Complete(ctx, id, cl.Token, omitted, time.Hour))
	got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, got.Status)
	assert.True(t, got.Response.BodyOmitted)

	// A failure another try may mend is not ErrNotStorable.
	p.Kill()
	err = s.Complete(ctx, engine.ID{Key: "down"}, 1, &engine.Response{Status: http.StatusOK}, time.Hour)
	require.Error(t, err)
	assert.NotErrorIs(t, err, engine.ErrNotStorable)
}
