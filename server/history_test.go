package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
)

// The tests in this file check, over loopback and on every store, that a
// key's history outlives its holders: a retry that takes a key over is told
// of the holders lost before it whatever the TTL and the lease, and a
// takeover that gives the key back does not make it forget them.

// historyScope and historyFingerprint are the scope and fingerprint of every
// request of these tests, so that a test can claim a key as a holder in
// another process would.
const (
	historyScope       = "acme"
	historyFingerprint = "order"
)

func historyOptions(opts ...server.Option) []server.Option {
	return append([]server.Option{
		server.WithScope(func(*http.Request) (string, error) { return historyScope, nil }),
		server.WithFingerprint(func(*http.Request, []byte) (string, error) { return historyFingerprint, nil }),
	}, opts...)
}

// loseHolder claims key on store as the middleware of a process that dies
// would, with its lease and TTL: it renews the lease every third of its
// length for renewFor, and is then lost, its lease left to run out.
func loseHolder(t *testing.T, store engine.Store, key string, lease, ttl, renewFor time.Duration) {
	t.Helper()
	ctx := context.Background()
	id := engine.ID{Scope: historyScope, Key: key}
	c, err := store.Claim(ctx, id, historyFingerprint, lease, ttl)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	if renewFor <= 0 {
		return
	}
	tick := time.NewTicker(lease / 3)
	defer tick.Stop()
	for end := time.Now().Add(renewFor); time.Now().Before(end); {
		<-tick.C // the renewal's own pace, as the middleware's timer
		require.NoError(t, store.Extend(ctx, id, c.Token, lease))
	}
}

// awaitLeaseEnd posts key until the answer is not the in-flight 409 (or is
// the final "outcome unknown", also a 409), which it returns.
func awaitLeaseEnd(t *testing.T, url, key string) reply {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := post(t, url, key, "{}")
		if got.status != http.StatusConflict || got.header.Get(engine.HeaderOutcome) != "" {
			return got
		}
		require.True(t, time.Now().Before(deadline), "key %s still in flight after 30s", key)
		time.Sleep(20 * time.Millisecond) // a client's pause between retries
	}
}

// abandonedSeen is a handler that answers with the status its run is given
// by status (201 when nil), and records what each run was told of abandoned
// holders.
type abandonedSeen struct {
	status func(run int) int

	mu   sync.Mutex
	seen []int
}

func (h *abandonedSeen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lease, _ := engine.LeaseFromContext(r.Context())
	h.mu.Lock()
	h.seen = append(h.seen, lease.Abandoned)
	run := len(h.seen)
	h.mu.Unlock()
	status := http.StatusCreated
	if h.status != nil {
		status = h.status(run)
	}
	w.WriteHeader(status)
}

func (h *abandonedSeen) runs() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.seen...)
}

// TestTakeoverSeenWhateverTheTTL: a holder lost with a TTL no longer than
// its lease (a TTL under the default lease makes the lease the TTL), or
// after renewals that took its lease past the TTL, is still seen by the
// retry that takes the key over: under the default policy the handler runs
// told of it, under RefuseAbandoned the retry is answered "outcome unknown"
// and nothing runs. A record that expired with the lease would be a new key:
// the handler would run as if for the first time.
func TestTakeoverSeenWhateverTheTTL(t *testing.T) {
	cases := []struct {
		name            string
		lease, ttl      time.Duration
		renewFor        time.Duration
		optLease, optTT bool // whether WithLease and WithTTL are given
	}{
		// WithTTL alone: the lease is the TTL.
		{name: "TTL under the default lease", lease: time.Second, ttl: time.Second, optTT: true},
		// WithLease(L), WithTTL(3L), the holder lost after 2.5 leases.
		{name: "lease renewed past the TTL", lease: 400 * time.Millisecond, ttl: 1200 * time.Millisecond,
			renewFor: 1000 * time.Millisecond, optLease: true, optTT: true},
	}
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			store := kind.New(t)
			for _, tc := range cases {
				for _, refuse := range []bool{false, true} {
					name := tc.name + ", rerun"
					if refuse {
						name = tc.name + ", refuse"
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						var cfg engine.Config
						if tc.optLease {
							cfg.Lease = tc.lease
						}
						if tc.optTT {
							cfg.TTL = tc.ttl
						}
						if refuse {
							cfg.Abandoned = engine.RefuseAbandoned
						}
						h := &abandonedSeen{}
						srv := fixtureWith(t, store, h, historyOptions(server.WithConfig(cfg))...)
						key := "lost-" + name
						loseHolder(t, store, key, tc.lease, tc.ttl, tc.renewFor)

						got := awaitLeaseEnd(t, srv.URL, key)
						if refuse {
							assert.Equal(t, http.StatusConflict, got.status)
							assert.Equal(t, "unknown", got.header.Get(engine.HeaderOutcome), "the retry is answered \"outcome unknown\"")
							assert.Empty(t, h.runs(), "the handler ran")
							return
						}
						assert.Equal(t, http.StatusCreated, got.status)
						assert.Equal(t, []int{1}, h.runs(), "Abandoned of each run: the takeover is told of the lost holder")
					})
				}
			}
		})
	}
}

// TestReleaseKeepsAbandoned: a takeover of a lost holder answers 5xx, which
// releases the key; the retry that runs next is told of the lost holder all
// the same, so a handler that looks for its own effect when a holder was
// lost (Example_takeover) still looks, and does not repeat it.
func TestReleaseKeepsAbandoned(t *testing.T) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			store := kind.New(t)
			const lease = 500 * time.Millisecond
			h := &abandonedSeen{status: func(run int) int {
				if run == 1 {
					return http.StatusServiceUnavailable // the takeover cannot tell yet
				}
				return http.StatusCreated
			}}
			srv := fixtureWith(t, store, h, historyOptions(server.WithConfig(engine.Config{Lease: lease}))...)
			loseHolder(t, store, "released", lease, time.Hour, 0)

			got := awaitLeaseEnd(t, srv.URL, "released")
			require.Equal(t, http.StatusServiceUnavailable, got.status, "the takeover's answer")
			got = post(t, srv.URL, "released", "{}")
			assert.Equal(t, http.StatusCreated, got.status, "the retry after the release runs")
			assert.Equal(t, []int{1, 1}, h.runs(), "Abandoned of each run")
		})
	}
}
