package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// The functions a caller gives the Client (the Dialect's, the Policy,
// the observer) may panic. Do recovers, so that a panic never leaves a
// response body open, a connection or a goroutine behind, logs the first panic of
// the Client, and goes on as if the function had returned nothing: a
// Policy that panics says "do not retry".

// callPolicy asks the Client's Policy about the result of an attempt.
func (c *call) callPolicy(resp *http.Response, err error) (retry bool) {
	defer func() {
		if v := recover(); v != nil {
			c.cfg.panicked(c.ctx, "retry policy", v)
			retry = false
		}
	}()
	return c.cfg.policy(resp, err)
}

// observe gives e to the Client's observer.
func (c *call) observe(e Event) {
	defer func() {
		if v := recover(); v != nil {
			c.cfg.panicked(c.ctx, "observer", v)
		}
	}()
	c.cfg.observer(c.ctx, e)
}

// panicked logs the panic v of the caller's function what, the first time
// one of the Client's functions panics: to the Client's logger, or, as a
// panic is a bug that should not go unseen, to slog's default logger.
func (cfg *config) panicked(ctx context.Context, what string, v any) {
	if !cfg.panicLogged.CompareAndSwap(false, true) {
		return
	}
	l := cfg.logger
	if l == nil {
		l = slog.Default()
	}
	l.LogAttrs(ctx, slog.LevelError, "idempotency: recovered a panic; later panics of the Client's functions are not logged",
		slog.String("function", what),
		slog.String("panic", fmt.Sprint(v)),
		slog.String("stack", string(debug.Stack())),
	)
}
