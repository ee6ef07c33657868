package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// lateAnswer is a Store whose first Claim is applied at once but answered
// only when the test says so, whatever its context: a store, or a network,
// that holds the answer back.
type lateAnswer struct {
	engine.Store
	applied chan struct{} // closed when the first acquiring Claim has been applied
	answer  chan struct{} // that Claim answers once this is closed
	once    sync.Once
}

func newLateAnswer(inner engine.Store) *lateAnswer {
	return &lateAnswer{Store: inner, applied: make(chan struct{}), answer: make(chan struct{})}
}

func (s *lateAnswer) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if err != nil || c.Status != engine.Acquired {
		return c, err
	}
	first := false
	s.once.Do(func() { first = true })
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
	store := newLateAnswer(mem)
	h := &orders{}
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: 200 * time.Millisecond, StoreTimeout: 5 * time.Second}))

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

// TestWaiterClaimAnsweredAfterItsLease: a WithWait waiter's acquiring Claim
// is answered after its lease ended, while another request took the key
// over and ran. The waiter must not run: 503 with Retry-After.
func TestWaiterClaimAnsweredAfterItsLease(t *testing.T) {
	mem := newMem(t)
	// The first request holds the key (its own Claim is the one delayed
	// otherwise): claim for it directly, as another instance would.
	c, err := mem.Claim(context.Background(), engine.ID{Key: "k"}, fingerprintOf(t, "x"), time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	store := newLateAnswer(mem)
	h := &orders{}
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: 200 * time.Millisecond, StoreTimeout: 5 * time.Second, Wait: time.Minute}))

	waiter := postAsync(srv.URL, "k", "x")
	// The holder gives the key back: the waiter's next Claim acquires it,
	// and its answer is held back.
	require.NoError(t, mem.Release(context.Background(), engine.ID{Key: "k"}, c.Token))
	recv(t, store.applied, "the waiter's claim to be applied")
	var b reply
	waitFor(t, "another request to take the key over", func() bool {
		b = post(t, srv.URL, "k", "x")
		return b.status != http.StatusConflict
	})
	require.Equal(t, http.StatusCreated, b.status)
	close(store.answer)
	got := recv(t, waiter, "the waiter's answer")
	assert.Equal(t, http.StatusServiceUnavailable, got.status, got.body)
	assert.NotEmpty(t, got.header.Get("Retry-After"))
	assert.Equal(t, int64(1), h.executions.Load(), "only the request that took over ran")
}

// fingerprintOf is the default fingerprint of the tests' POST / with body.
func fingerprintOf(t *testing.T, body string) string {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	fp, err := server.Fingerprint(r, []byte(body))
	require.NoError(t, err)
	return fp
}
