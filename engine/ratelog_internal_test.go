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

// panicking is a log handler that panics.
type panicking struct{ slog.Handler }

func (panicking) Enabled(context.Context, slog.Level) bool  { panic("enabled") }
func (panicking) Handle(context.Context, slog.Record) error { panic("handle") }

// TestRateLimitedPanics: a log handler that panics neither stops the
// engine's call nor passes its panic on: it is taken as disabled, and its
// record as dropped with an error.
func TestRateLimitedPanics(t *testing.T) {
	h := newRateLimited(panicking{slog.DiscardHandler}, time.Second)
	if h.Enabled(context.Background(), slog.LevelError) {
		t.Error("Enabled = true from a handler that panics")
	}
	err := h.Handle(context.Background(), slog.NewRecord(time.Now(), slog.LevelError, "m", 0))
	if err == nil || !strings.HasPrefix(err.Error(), "engine: log handler panicked: handle") {
		t.Errorf("Handle = %v, want the panic as an engine error", err)
	}
}

// TestRateLimitedLevels: the next handler decides which levels pass.
func TestRateLimitedLevels(t *testing.T) {
	var out bytes.Buffer
	h := newRateLimited(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), time.Second)
	if h.Enabled(context.Background(), slog.LevelInfo) || !h.Enabled(context.Background(), slog.LevelError) {
		t.Error("Enabled does not follow the next handler's level")
	}
	log := slog.New(h)
	log.Info("quiet")
	log.Warn("loud")
	if got := out.String(); strings.Contains(got, "quiet") || !strings.Contains(got, "loud") {
		t.Errorf("logged %q, want the warning only", got)
	}
}

// TestRateLimitedShared: handlers made by WithGroup and WithAttrs share the
// limit, and keep their own group and attributes.
func TestRateLimitedShared(t *testing.T) {
	var out bytes.Buffer
	h := newRateLimited(slog.NewTextHandler(&out, nil), time.Second)
	now := time.Unix(1000, 0)
	h.state.now = func() time.Time { return now }
	grouped := slog.New(h.WithGroup("g").WithAttrs([]slog.Attr{slog.String("a", "b")}))
	grouped.Error("m", "x", 1)
	slog.New(h).Error("m")
	now = now.Add(time.Second)
	slog.New(h).Error("m")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if assert.Len(t, lines, 2, out.String()) {
		assert.Contains(t, lines[0], "g.a=b g.x=1")
		assert.Contains(t, lines[1], "suppressed=1")
		assert.NotContains(t, lines[1], "g.a")
	}
}
