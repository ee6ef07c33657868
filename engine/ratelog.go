package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// rateLimited is a slog.Handler that passes on at most one record per
// message per interval, so that a store outage, which fails every request
// the same way, is a line a second in the log rather than a line a request.
// The first record of a message after some were dropped carries their
// number. Handlers made by WithAttrs and WithGroup share the limit: it is
// the message that is limited, not the handler.
type rateLimited struct {
	next  slog.Handler
	state *rateState
}

type rateState struct {
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	seen map[string]*rateEntry
}

type rateEntry struct {
	last       time.Time
	suppressed int
}

// maxMessages bounds the messages remembered. The middleware's messages are
// a fixed set, far fewer; forgetting them all at the bound keeps memory
// bounded whatever logs through the handler.
const maxMessages = 256

func newRateLimited(next slog.Handler, every time.Duration) *rateLimited {
	return &rateLimited{next: next, state: &rateState{every: every, now: time.Now, seen: make(map[string]*rateEntry)}}
}

// Enabled asks the next handler; a panic in it, like one in Handle, is
// taken as "not enabled".
func (h *rateLimited) Enabled(ctx context.Context, level slog.Level) (on bool) {
	defer func() {
		if recover() != nil {
			on = false
		}
	}()
	return h.next.Enabled(ctx, level)
}

// Handle passes r on, unless its message was passed on less than an interval
// ago. A panic in the handler it passes to, which the application gave
// (WithLogger), is returned as an error, which slog drops: the middleware
// logs while a key is held, and a log line must not leave it claimed.
func (h *rateLimited) Handle(ctx context.Context, r slog.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("engine: log handler panicked: %v", v)
		}
	}()
	suppressed, ok := h.state.admit(r.Message)
	if !ok {
		return nil
	}
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", suppressed))
	}
	return h.next.Handle(ctx, r)
}

// admit reports whether a record of msg goes through now, and how many were
// dropped since the last one that did.
func (s *rateState) admit(msg string) (suppressed int, ok bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.seen[msg]
	if e == nil {
		if len(s.seen) >= maxMessages {
			clear(s.seen)
		}
		s.seen[msg] = &rateEntry{last: now}
		return 0, true
	}
	if now.Sub(e.last) < s.every {
		e.suppressed++
		return 0, false
	}
	suppressed = e.suppressed
	e.last, e.suppressed = now, 0
	return suppressed, true
}

func (h *rateLimited) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &rateLimited{next: h.next.WithAttrs(attrs), state: h.state}
}

func (h *rateLimited) WithGroup(name string) slog.Handler {
	return &rateLimited{next: h.next.WithGroup(name), state: h.state}
}
