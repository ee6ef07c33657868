package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// smallRecords is a Store that refuses, every time, a response whose body
// is larger than limit, as a Redis with a small proto-max-bulk-len does.
type smallRecords struct {
	engine.Store
	limit     int
	completes atomic.Int32
}

func (s *smallRecords) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	s.completes.Add(1)
	if len(resp.Body) > s.limit {
		return fmt.Errorf("smallrecords: complete: %d bytes: %w", len(resp.Body), engine.ErrNotStorable)
	}
	return s.Store.Complete(ctx, id, token, resp, ttl)
}

// TestResponseNeverStorable: the store will never take the response. The
// client gets it whole, and the request is recorded as done without its
// body, so that no retry runs it again.
func TestResponseNeverStorable(t *testing.T) {
	store := &smallRecords{Store: newMem(t), limit: 100}
	var runs atomic.Int32
	body := strings.Repeat("b", 1000)
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	})
	var logs syncBuffer
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: 50 * time.Millisecond, StoreTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, first.status)
	assert.Equal(t, body, first.body, "the client gets the whole response")
	assert.Equal(t, int32(2), store.completes.Load(), "one refusal, then the record without its body")
	for range 3 {
		again := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusCreated, again.status)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, "true", again.header.Get(server.HeaderBodyOmitted))
		assert.Equal(t, "text/plain", again.header.Get("Content-Type"))
		assert.Empty(t, again.body)
	}
	assert.Equal(t, int32(1), runs.Load(), "the request ran once")
	assert.Contains(t, logs.String(), "recording the request as done without its body")
}
