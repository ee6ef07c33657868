package server

import (
	"context"
	"fmt"
)

// Shutdown waits for the responses that are being stored after they were
// sent (a Complete that failed within the store timeout goes on being tried
// in the background, for one lease at most) and returns nil once they are
// all stored or given up; if ctx ends first, it stops them, waits for them
// to return, and returns ctx's error: their keys stay in flight until their
// leases end, and a retry after that runs the request again.
//
// Call it after http.Server.Shutdown has returned, so that no request is
// still in the middleware. After Shutdown, the middleware goes on serving,
// but a late Complete runs on its request's goroutine, which the server's
// own shutdown waits for, as it does beyond 1024 late Completes at once or
// 64 MiB of their responses. Shutdown may be called more than once.
func (m *Middleware) Shutdown(ctx context.Context) error {
	if err := m.engine.Shutdown(ctx); err != nil {
		// The engine gives up only when ctx ends.
		return fmt.Errorf("server: shutdown: %w", ctx.Err())
	}
	return nil
}
