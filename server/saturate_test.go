package server_test

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// clockStore is a Store whose time arithmetic cannot overflow (it compares
// time.Time values, which saturate), so that a test of the middleware's own
// arithmetic at extreme durations sees only the middleware's.
type clockStore struct {
	mu    sync.Mutex
	token engine.Token
	recs  map[engine.ID]*clockRecord
}

type clockRecord struct {
	fp         string
	token      engine.Token
	leaseUntil time.Time
	expires    time.Time
	resp       *engine.Response
}

func (s *clockStore) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	if err := ctx.Err(); err != nil {
		return engine.Claim{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	r := s.recs[id]
	if r != nil && now.Before(r.expires) {
		switch {
		case r.resp != nil:
			return engine.Claim{Status: engine.Completed, Fingerprint: r.fp, Response: r.resp}, nil
		case now.Before(r.leaseUntil):
			return engine.Claim{Status: engine.InFlight, Fingerprint: r.fp, RetryAfter: r.leaseUntil.Sub(now)}, nil
		}
	}
	s.token++
	if s.recs == nil {
		s.recs = map[engine.ID]*clockRecord{}
	}
	s.recs[id] = &clockRecord{fp: fp, token: s.token, leaseUntil: now.Add(lease), expires: now.Add(max(lease, ttl))}
	return engine.Claim{Status: engine.Acquired, Token: s.token}, nil
}

func (s *clockStore) held(ctx context.Context, id engine.ID, token engine.Token) (*clockRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := s.recs[id]
	if r == nil || r.token != token || r.resp != nil {
		return nil, engine.ErrLeaseLost
	}
	return r, nil
}

func (s *clockStore) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(ctx, id, token)
	if err == nil {
		r.resp, r.expires = resp, time.Now().Add(ttl)
	}
	return err
}

func (s *clockStore) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.held(ctx, id, token)
	if err == nil {
		delete(s.recs, id)
	}
	return err
}

func (s *clockStore) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(ctx, id, token)
	if err == nil {
		r.leaseUntil = time.Now().Add(lease)
	}
	return err
}

// TestDurationExtremes: every duration option at its smallest accepted
// value and at math.MaxInt64 gives the documented answers: the first
// request runs once, a concurrent duplicate gets 409 with a Retry-After in
// range, a retry gets the replay.
func TestDurationExtremes(t *testing.T) {
	const forever = time.Duration(math.MaxInt64)
	for _, tc := range []struct {
		name        string
		opts        []server.Option
		unavailable bool // every Claim times out
		retryAfter  string
	}{
		{name: "lease and TTL at their minimum", opts: []server.Option{server.WithConfig(engine.Config{Lease: 10 * time.Millisecond, TTL: 10 * time.Millisecond})}},
		{name: "lease and TTL forever", opts: []server.Option{server.WithConfig(engine.Config{Lease: forever, TTL: forever})}, retryAfter: "1"},
		{name: "TTL forever", opts: []server.Option{server.WithConfig(engine.Config{TTL: forever})}, retryAfter: "1"},
		{name: "wait of 1ns", opts: []server.Option{server.WithConfig(engine.Config{Wait: time.Nanosecond})}, retryAfter: "1"},
		{name: "wait forever", opts: []server.Option{server.WithConfig(engine.Config{Wait: forever})}},
		{name: "store timeout of 1ns", opts: []server.Option{server.WithConfig(engine.Config{StoreTimeout: time.Nanosecond})}, unavailable: true},
		{name: "store timeout forever", opts: []server.Option{server.WithConfig(engine.Config{StoreTimeout: forever})}, retryAfter: "1"},
		{name: "Retry-After of 1ns", opts: []server.Option{server.WithConfig(engine.Config{RetryAfter: time.Nanosecond})}, retryAfter: "1"},
		{name: "Retry-After forever", opts: []server.Option{server.WithConfig(engine.Config{RetryAfter: forever, Lease: forever, TTL: forever})},
			// The lease is taken as 100 years (the engine's largest duration), and a
			// 409's Retry-After is never longer than the lease has left.
			retryAfter: strconv.FormatInt(int64(100*365*24*time.Hour/time.Second), 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newBlocking()
			srv := fixtureWith(t, &clockStore{}, h, tc.opts...)
			first := postAsync(srv.URL, "k", "x")
			if tc.unavailable {
				got := recv(t, first, "the answer")
				assert.Equal(t, http.StatusServiceUnavailable, got.status)
				assert.Zero(t, h.executions.Load(), "the handler did not run")
				return
			}
			recv(t, h.started, "the handler to start")
			if tc.retryAfter != "" {
				dup := post(t, srv.URL, "k", "x")
				assert.Equal(t, http.StatusConflict, dup.status, "a concurrent duplicate")
				assert.Equal(t, tc.retryAfter, dup.header.Get("Retry-After"))
			}
			close(h.release)
			got := recv(t, first, "the first answer")
			if got.status == http.StatusServiceUnavailable {
				// The lease of 10ms may end before the handler's
				// answer is stored: then nothing was kept.
				require.Contains(t, tc.name, "minimum", "503 only for the shortest lease: %s", got.body)
				return
			}
			require.Equal(t, http.StatusCreated, got.status, got.body)
			again := post(t, srv.URL, "k", "x")
			if tc.name != "lease and TTL at their minimum" {
				assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"), "a retry is replayed: %d %s", again.status, again.body)
				assert.Equal(t, int64(1), h.executions.Load(), "the handler ran once")
			}
		})
	}
}
