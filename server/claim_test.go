package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
)

// lateAnswer is a Store whose first Claim is applied at once but answered
// only when the test says so, whatever its context: a store, or a network,
// that holds the answer back.
type lateAnswer struct {
	server.Store
	applied chan struct{} // closed when the first Claim has been applied
	answer  chan struct{} // the first Claim answers once this is closed
	once    sync.Once
}

func (s *lateAnswer) Claim(ctx context.Context, id server.ID, fp string, lease, ttl time.Duration) (server.Claim, error) {
	first := false
	s.once.Do(func() { first = true })
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if first {
		close(s.applied)
		<-s.answer
	}
	return c, err
}

// TestClaimAnsweredAfterItsLease: request A's Claim is applied at once but
// answered after its lease ended; meanwhile B took the key over and ran.
// A's handler must not run: it is answered 503 with Retry-After.
func TestClaimAnsweredAfterItsLease(t *testing.T) {
	mem := newMem(t)
	store := &lateAnswer{Store: mem, applied: make(chan struct{}), answer: make(chan struct{})}
	h := &orders{}
	srv := fixtureWith(t, store, h, server.WithLease(200*time.Millisecond), server.WithStoreTimeout(5*time.Second))

	a := postAsync(srv.URL, "k", "x")
	recv(t, store.applied, "A's claim to be applied")
	var b reply
	waitFor(t, "B to take the key over", func() bool {
		b = post(t, srv.URL, "k", "x")
		return b.status != http.StatusConflict
	})
	require.Equal(t, http.StatusCreated, b.status, "B took the expired lease over and ran")
	close(store.answer)
	got := recv(t, a, "A's answer")
	assert.Equal(t, http.StatusServiceUnavailable, got.status, "A's claim came after its lease: %s", got.body)
	assert.NotEmpty(t, got.header.Get("Retry-After"))
	assert.Equal(t, int64(1), h.executions.Load(), "only B ran")
	again := post(t, srv.URL, "k", "x")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"), "B's record is intact")
	assert.Equal(t, b.body, again.body)
}
