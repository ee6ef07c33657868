package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/idemkit/idempotency/engine"
)

// events records what the observer is told.
type events struct {
	mu  sync.Mutex
	all []engine.Event
}

func (r *events) observe(ctx context.Context, ev engine.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, ev)
}

// kinds returns the kinds of the events, lease renewals left out.
func (r *events) kinds() []engine.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []engine.EventKind
	for _, ev := range r.all {
		if ev.Kind != engine.EventLeaseRenewed {
			ks = append(ks, ev.Kind)
		}
	}
	return ks
}

// final returns the call's final event: the last that is not about the
// lease or the claim's acquisition.
func (r *events) final() (engine.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.all) - 1; i >= 0; i-- {
		switch r.all[i].Kind {
		case engine.EventLeaseRenewed, engine.EventLeaseLost, engine.EventAcquired:
			continue
		}
		return r.all[i], true
	}
	return engine.Event{}, false
}

// logs records the messages the engine logs.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }

func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

func (l *logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logs) WithGroup(string) slog.Handler      { return l }

// count returns how many messages contain part.
func (l *logs) count(part string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, part) {
			n++
		}
	}
	return n
}

// slogOf returns a logger that records into l.
func slogOf(l *logs) *slog.Logger { return slog.New(l) }
