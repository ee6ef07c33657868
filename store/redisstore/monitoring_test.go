package redisstore_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// TestMonitoringCommandsDocumented: the commands tested below are those
// the documentation gives.
func TestMonitoringCommandsDocumented(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	for _, cmd := range []string{"DBSIZE", "INFO memory", "SCAN 0 MATCH idempotency:* COUNT 1000", "MEMORY USAGE <key>"} {
		assert.Contains(t, string(src), "//\t"+cmd+"\n")
	}
}

// fill makes completed records for keys, and one released record.
func fill(t *testing.T, ctx context.Context, s redisstore.Store, keys ...string) {
	t.Helper()
	for _, key := range keys {
		id := engine.ID{Scope: "monitoring", Key: key}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, id, c.Token, &engine.Response{Status: 201, Body: []byte(`{"id":1}`)}, time.Hour))
	}
	id := engine.ID{Scope: "monitoring", Key: "released"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, id, c.Token))
}

// TestMonitoringSharedRedis: on a Redis shared with other data, SCAN under
// the prefix counts the records, released ones included, and MEMORY USAGE
// adds up their bytes.
func TestMonitoringSharedRedis(t *testing.T) {
	ctx := t.Context()
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
	require.NoError(t, err)
	fill(t, ctx, s, "a", "b", "c")

	var records, bytes int64
	cursor := uint64(0)
	for {
		// SCAN <cursor> MATCH <prefix>* COUNT 1000
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		require.NoError(t, err)
		for _, key := range keys {
			records++
			n, err := c.MemoryUsage(ctx, key).Result()
			require.NoError(t, err)
			bytes += n
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	assert.Equal(t, int64(4), records, "records, the released one included")
	assert.Positive(t, bytes)
}

// TestMonitoringDedicatedRedis: on a Redis that holds only the Store's
// records, DBSIZE counts them and INFO memory has the bytes.
func TestMonitoringDedicatedRedis(t *testing.T) {
	needRedisServer(t)
	p := startRedis(t)
	ctx := t.Context()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	require.NoError(t, err)
	fill(t, ctx, s, "a", "b", "c", "d", "e")

	n, err := c.DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(6), n, "DBSIZE, the released record included")
	info, err := c.Info(ctx, "memory").Result()
	require.NoError(t, err)
	used := infoField(t, info, "used_memory")
	dataset := infoField(t, info, "used_memory_dataset")
	assert.Positive(t, dataset)
	assert.Greater(t, used, dataset)
}

// infoField returns the number of field name in a reply of INFO.
func infoField(t *testing.T, info, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, "%s: %q", name, v)
			return n
		}
	}
	t.Fatalf("INFO has no %s:\n%s", name, info)
	return 0
}
