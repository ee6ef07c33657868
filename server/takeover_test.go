package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/incoming"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/wire"
	"github.com/idemkit/idempotency/server"
)

// abandoning is a Store whose first acquiring Claim reports that it took
// over from abandoned holders, as a store does after the holders' process
// died.
type abandoning struct {
	engine.Store
	abandoned int
	once      sync.Once
}

func (s *abandoning) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if err == nil && c.Status == engine.Acquired {
		s.once.Do(func() { c.Abandoned = s.abandoned })
	}
	return c, err
}

// TestTakeoverVisible: the handler sees, in its context, the key, the
// scope, how many holders were abandoned before it and its attempt number,
// and the incoming key the client derives downstream keys from.
func TestTakeoverVisible(t *testing.T) {
	for _, abandoned := range []int{0, 2} {
		t.Run(fmt.Sprint(abandoned), func(t *testing.T) {
			store := &abandoning{Store: newMem(t), abandoned: abandoned}
			type seen struct {
				lease engine.Lease
				in    incoming.Key
				ok    bool
			}
			got := make(chan seen, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var s seen
				s.lease, s.ok = engine.LeaseFromContext(r.Context())
				if in, ok := incoming.FromContext(r.Context()); ok {
					s.in = *in
				} else {
					s.ok = false
				}
				got <- s
				w.WriteHeader(http.StatusCreated)
			})
			srv := fixtureWith(t, store, h, server.WithScope(func(*http.Request) (string, error) { return "acme", nil }))
			assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k", "x").status)
			s := recv(t, got, "the handler's view")
			require.True(t, s.ok, "lease and incoming key in the context")
			assert.Equal(t, engine.ID{Scope: "acme", Key: "k"}, s.lease.ID)
			assert.Equal(t, abandoned, s.lease.Abandoned)
			assert.Equal(t, abandoned, s.lease.Abandoned)
			assert.Equal(t, incoming.Key{Scope: "acme", Key: "k"}, s.in)
		})
	}
}

// TestRefuseAbandoned: under RefuseAbandoned, a takeover of an abandoned
// key records a final "outcome unknown" problem, 409 without Retry-After,
// replayed to every retry; the handler never runs.
func TestRefuseAbandoned(t *testing.T) {
	mem := newMem(t)
	store := &abandoning{Store: mem, abandoned: 1}
	h := &orders{}
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Abandoned: engine.RefuseAbandoned}))
	for i, replayed := range []string{"", "true", "true"} {
		got := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusConflict, got.status, "answer %d", i)
		assert.Empty(t, got.header.Get("Retry-After"), "final: no Retry-After")
		assert.Equal(t, replayed, got.header.Get("Idempotent-Replayed"), "answer %d", i)
		assert.Equal(t, "unknown", got.header.Get(engine.HeaderOutcome))
		var p struct{ Type string }
		require.NoError(t, json.Unmarshal([]byte(got.body), &p), got.body)
		assert.Equal(t, wire.TypeOutcomeUnknown, p.Type)
	}
	assert.Zero(t, h.executions.Load(), "the handler never ran")
	c, err := mem.Claim(context.Background(), engine.ID{Key: "k"}, "", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, c.Status)
	assert.True(t, c.Response.OutcomeUnknown(), "an operator can tell the record from a completed request")

	// A key never abandoned runs as usual, and its record is not marked.
	assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k2", "x").status)
	c, err = mem.Claim(context.Background(), engine.ID{Key: "k2"}, "", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, c.Status)
	assert.False(t, c.Response.OutcomeUnknown())
}

// TestRefuseAbandonedStoreFails: if the answer cannot be recorded, the
// request is answered 503 and the key is not released: a release would
// forget the abandoned holders, and the retry would run.
func TestRefuseAbandonedStoreFails(t *testing.T) {
	fs, _ := faulty(t)
	fs.Set(faultstore.Complete, faultstore.Fault{Err: errFlaky})
	store := &abandoning{Store: fs, abandoned: 1}
	h := &orders{}
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Abandoned: engine.RefuseAbandoned, StoreTimeout: 20 * time.Millisecond}))
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusServiceUnavailable, got.status)
	assert.NotEmpty(t, got.header.Get("Retry-After"))
	assert.Empty(t, got.header.Get(engine.HeaderOutcome))
	assert.Zero(t, fs.Calls(faultstore.Release), "the key is not released")
	assert.Zero(t, h.executions.Load())
	assert.Equal(t, http.StatusConflict, post(t, srv.URL, "k", "x").status, "the key stays claimed")
}
