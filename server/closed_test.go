package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// closable is a Store that can be closed while requests run: from then on
// every call fails with an error wrapping engine.ErrStoreClosed, as a
// closed memstore's do. Before that, its first failing Completes fail as a
// store that is down would.
type closable struct {
	engine.Store
	closed    atomic.Bool
	flaky     atomic.Int32 // Completes to fail before closing
	completes atomic.Int32
}

func (s *closable) err(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("closable: %s: %w", op, engine.ErrStoreClosed)
	}
	return nil
}

func (s *closable) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	s.completes.Add(1)
	if s.flaky.Add(-1) >= 0 {
		if s.flaky.Load() == 0 {
			s.closed.Store(true)
		}
		return errFlaky
	}
	if err := s.err("complete"); err != nil {
		return err
	}
	return s.Store.Complete(ctx, id, token, resp, ttl)
}

func (s *closable) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	if err := s.err("extend"); err != nil {
		return err
	}
	return s.Store.Extend(ctx, id, token, lease)
}

// TestStoreClosedWhileRunning: a store closed while a request runs ends its
// store writes at once: the answer is not a store timeout late, no late
// Complete waits a lease, Shutdown returns at once, and the log does not
// promise a rerun for a store that no longer exists.
func TestStoreClosedWhileRunning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flaky int32 // Completes that fail before the store is closed
	}{
		{"closed before Complete", 0},
		{"closed during the late Complete", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &closable{Store: newMem(t)}
			store.flaky.Store(tc.flaky)
			var logs syncBuffer
			h := newBlocking()
			mw, err := server.New(store, server.WithConfig(engine.Config{StoreTimeout: 30 * time.Millisecond, Lease: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
			require.NoError(t, err)
			srv := startServer(t, mw.Handler(h))
			got := postAsync(srv.URL, "k", "x")
			recv(t, h.started, "the handler to start")
			if tc.flaky == 0 {
				store.closed.Store(true)
			}
			close(h.release)
			assert.Equal(t, http.StatusCreated, recv(t, got, "the answer").status)
			srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, mw.Shutdown(ctx), "Shutdown does not wait a lease")
			assert.Equal(t, tc.flaky+1, store.completes.Load(), "no Complete after the store said it was closed")
			assert.Contains(t, logs.String(), "the store was closed")
			assert.NotContains(t, logs.String(), "runs the request again")
		})
	}
}
