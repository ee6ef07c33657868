package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRateLimited: one record per message per interval passes; the next one
// after the interval carries the number dropped; other messages, and
// handlers derived with WithAttrs, share nothing but the limit.
func TestRateLimited(t *testing.T) {
	var out bytes.Buffer
	h := newRateLimited(slog.NewTextHandler(&out, nil), time.Second)
	now := time.Unix(1000, 0)
	h.state.now = func() time.Time { return now }
	log := slog.New(h)
	withKey := log.With("key", "k")

	for range 5 {
		log.Error("store failed")
	}
	withKey.Error("store failed")
	log.Warn("lease not renewed")
	now = now.Add(999 * time.Millisecond)
	log.Error("store failed")
	now = now.Add(time.Millisecond)
	log.Error("store failed")
	log.Error("store failed")

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if assert.Len(t, lines, 3, out.String()) {
		assert.Contains(t, lines[0], `msg="store failed"`)
		assert.NotContains(t, lines[0], "suppressed")
		assert.Contains(t, lines[1], `msg="lease not renewed"`)
		assert.Contains(t, lines[2], `msg="store failed" suppressed=6`)
	}
}

// TestRateLimitedBounded: the messages remembered are bounded.
func TestRateLimitedBounded(t *testing.T) {
	h := newRateLimited(slog.DiscardHandler, time.Second)
	for i := range 3 * maxMessages {
		h.Handle(context.Background(), slog.NewRecord(time.Now(), slog.LevelError, strings.Repeat("m", i), 0))
	}
	assert.LessOrEqual(t, len(h.state.seen), maxMessages)
}
