package redisstore_test

import (
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

// TestNewNamesEveryInvalidOption: New names every invalid option, a nil one
// and a nil logger included, in one joined error, and makes no Store. New
// does no I/O, so the client needs no server.
func TestNewNamesEveryInvalidOption(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	s, err := redisstore.New(client,
		redisstore.WithReplicaAck(0, time.Second),
		nil,
		redisstore.WithLogger(nil),
		redisstore.WithReplicaAck(1, 0),
	)
	require.Error(t, err)
	assert.Nil(t, s)
	lines := strings.Split(err.Error(), "\n")
	assert.Len(t, lines, 4, "one line per invalid option: %q", err)
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "redisstore: "), "line %q has no package prefix", l)
	}
	assert.Contains(t, err.Error(), "option 1 is nil")
	assert.Contains(t, err.Error(), "WithLogger")

	s, err = redisstore.New(client, redisstore.WithLogger(slog.New(slog.DiscardHandler)),
		redisstore.WithPrefix("t:"), redisstore.WithStrictEviction(), redisstore.WithReplicaAck(1, time.Nanosecond))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(s.RecordKey(engine.ID{Key: "k"}), "t:"), "RecordKey = %q, want the prefix t:", s.RecordKey(engine.ID{Key: "k"}))
}
