package redisstore_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitLeaseEnd polls Claim with another fingerprint until the lease of id has
// run out: the in-flight answer's RetryAfter is then 0.
func waitLeaseEnd(t *testing.T, claim func() (engine.Claim, error)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := claim()
		require.NoError(t, err)
		if c.Status != engine.InFlight || c.RetryAfter == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease still held after 5s: %+v", c)
		}
		time.Sleep(min(c.RetryAfter, 10*time.Millisecond)) // the lease's own time, not a condition's
	}
}

// A takeover of an expired lease counts the holders that came before; a
// release forgets them.
func TestClaimAbandoned(t *testing.T) {
	t.Parallel()
	s, _ := sharedStore(t)
	ctx := context.Background()
	id := engine.ID{Scope: "t", Key: "abandoned"}
	const lease = 30 * time.Millisecond

	var tokens []engine.Token
	for want := range 3 {
		if want > 0 {
			waitLeaseEnd(t, func() (engine.Claim, error) { return s.Claim(ctx, id, "other", lease, time.Minute) })
		}
		c, err := s.Claim(ctx, id, "fp", lease, time.Minute)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status, "claim %d", want)
		assert.Equal(t, want, c.Abandoned, "claim %d: Abandoned", want)
		if len(tokens) > 0 {
			assert.Greater(t, c.Token, tokens[len(tokens)-1], "a takeover's token")
		}
		tokens = append(tokens, c.Token)
	}
	// The earlier holders' tokens are refused.
	for _, tok := range tokens[:2] {
		err := s.Complete(ctx, id, tok, &engine.Response{Status: http.StatusOK}, time.Minute)
		assert.ErrorIs(t, err, engine.ErrLeaseLost)
	}
	r, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, 2, r.Abandoned, "Lookup's Abandoned")

	require.NoError(t, s.Release(ctx, id, tokens[2]))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status)
	// A release by a holder that took the record over keeps the count of
	// the holders lost before it.
	assert.Equal(t, 2, c.Abandoned, "Abandoned after a release")
	assert.Greater(t, c.Token, tokens[2], "the token after a release")

	// The completed record keeps the count of the lease that completed it.
	id2 := engine.ID{Scope: "t", Key: "abandoned-then-completed"}
	_, err = s.Claim(ctx, id2, "fp", lease, time.Minute)
	require.NoError(t, err)
	waitLeaseEnd(t, func() (engine.Claim, error) { return s.Claim(ctx, id2, "other", lease, time.Minute) })
	c, err = s.Claim(ctx, id2, "fp", time.Minute, time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, c.Abandoned)
	require.NoError(t, s.Complete(ctx, id2, c.Token, &engine.Response{Status: http.StatusCreated}, time.Minute))
	r, err = s.Lookup(ctx, id2)
	require.NoError(t, err)
	assert.True(t, r.Completed)
	assert.Equal(t, 1, r.Abandoned, "completed record's Abandoned")
}

func TestLookup(t *testing.T) {
	t.Parallel()
	s, _ := sharedStore(t)
	ctx := context.Background()

	_, err := s.Lookup(ctx, engine.ID{Key: "never"})
	assert.ErrorIs(t, err, engine.ErrNotFound, "a key never claimed")

	id := engine.ID{Scope: "tenant", Key: "lookup"}
	before := time.Now()
	c, err := s.Claim(ctx, id, "fp-1", time.Minute, time.Hour)
	require.NoError(t, err)
	r, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, id, r.ID)
	assert.False(t, r.Completed)
	assert.Equal(t, "fp-1", r.Fingerprint)
	assert.Equal(t, c.Token, r.Token)
	assert.Equal(t, 0, r.Abandoned)
	assert.Nil(t, r.Response)
	// The server's clock and this one are the same machine's here.
	assert.WithinDuration(t, before, r.Created, 2*time.Second, "Created")
	assert.WithinDuration(t, r.Created.Add(time.Minute), r.LeaseEnds, 2*time.Second, "LeaseEnds")
	assert.WithinDuration(t, r.LeaseEnds.Add(time.Hour), r.Expires, 2*time.Second, "Expires: the TTL after the lease")

	resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/o/1"}}, Body: []byte("{}")}
	require.NoError(t, s.Complete(ctx, id, c.Token, resp, 2*time.Hour))
	r, err = s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.True(t, r.Completed)
	assert.Equal(t, "fp-1", r.Fingerprint)
	require.NotNil(t, r.Response)
	assert.Equal(t, resp.Status, r.Response.Status)
	assert.Equal(t, resp.Body, r.Response.Body)
	assert.Equal(t, resp.Header, r.Response.Header)
	assert.WithinDuration(t, time.Now().Add(2*time.Hour), r.Expires, 2*time.Second, "Expires after Complete")
	assert.WithinDuration(t, before, r.Created, 2*time.Second, "Created after Complete")

	// Released: not found.
	id3 := engine.ID{Key: "released"}
	c, err = s.Claim(ctx, id3, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, id3, c.Token))
	_, err = s.Lookup(ctx, id3)
	assert.ErrorIs(t, err, engine.ErrNotFound, "a released record")
}

func TestResolve(t *testing.T) {
	t.Parallel()
	s, _ := sharedStore(t)
	ctx := context.Background()
	resp := &engine.Response{Status: http.StatusCreated, Body: []byte("settled")}

	err := s.Resolve(ctx, engine.ID{Key: "never"}, resp, time.Hour)
	assert.ErrorIs(t, err, engine.ErrNotFound)

	t.Run("with a response", func(t *testing.T) {
		id := engine.ID{Key: "resolve-response"}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.Resolve(ctx, id, resp, time.Hour))
		// The holder is refused, its effect recorded as resp.
		for name, call := range map[string]func() error{
			"Complete": func() error { return s.Complete(ctx, id, c.Token, &engine.Response{Status: 500}, time.Hour) },
			"Extend":   func() error { return s.Extend(ctx, id, c.Token, time.Minute) },
			"Release":  func() error { return s.Release(ctx, id, c.Token) },
		} {
			assert.ErrorIs(t, call(), engine.ErrLeaseLost, name)
		}
		got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Completed, got.Status)
		assert.Equal(t, "fp", got.Fingerprint)
		assert.Equal(t, resp.Body, got.Response.Body)
		r, err := s.Lookup(ctx, id)
		require.NoError(t, err)
		assert.True(t, r.Completed)
		assert.False(t, r.Created.IsZero(), "Created kept")
	})
	t.Run("nil", func(t *testing.T) {
		id := engine.ID{Key: "resolve-nil"}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.Resolve(ctx, id, nil, time.Hour))
		_, err = s.Lookup(ctx, id)
		assert.ErrorIs(t, err, engine.ErrNotFound)
		assert.ErrorIs(t, s.Complete(ctx, id, c.Token, resp, time.Hour), engine.ErrLeaseLost)
		assert.ErrorIs(t, s.Resolve(ctx, id, nil, time.Hour), engine.ErrNotFound, "resolving it again")
		next, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, engine.Acquired, next.Status)
		assert.Equal(t, 0, next.Abandoned)
		assert.Greater(t, next.Token, c.Token)
	})
	t.Run("completed", func(t *testing.T) {
		id := engine.ID{Key: "resolve-completed"}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, id, c.Token, &engine.Response{Status: 200}, time.Hour))
		require.NoError(t, s.Resolve(ctx, id, resp, time.Hour))
		got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, resp.Status, got.Response.Status)
	})
}

// Leases and TTLs at their extremes: 1ns is the shortest Redis can keep (a
// millisecond), math.MaxInt64 the longest a Duration holds.
func TestExtremeDurations(t *testing.T) {
	t.Parallel()
	s, _ := sharedStore(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		lease, ttl time.Duration
	}{
		{"1ns", time.Nanosecond, time.Nanosecond},
		{"max", math.MaxInt64, math.MaxInt64},
		{"lease 1ns, ttl max", time.Nanosecond, math.MaxInt64},
		{"lease max, ttl 1ns", math.MaxInt64, time.Nanosecond},
		{"0", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := engine.ID{Key: "extreme-" + tc.name}
			c, err := s.Claim(ctx, id, "fp", tc.lease, tc.ttl)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
			err = s.Extend(ctx, id, c.Token, tc.lease)
			if err != nil && !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("Extend error = %v", err)
			}
			if tc.lease == math.MaxInt64 {
				require.NoError(t, err, "Extend of a lease that cannot have ended")
				dup, err := s.Claim(ctx, id, "fp", tc.lease, tc.ttl)
				require.NoError(t, err)
				assert.Equal(t, engine.InFlight, dup.Status, "a duplicate during a MaxInt64 lease")
			}
			err = s.Complete(ctx, id, c.Token, &engine.Response{Status: 200}, tc.ttl)
			if tc.lease == math.MaxInt64 {
				require.NoError(t, err)
			}
			if tc.ttl == math.MaxInt64 && err == nil {
				got, err := s.Claim(ctx, id, "fp", tc.lease, tc.ttl)
				require.NoError(t, err)
				assert.Equal(t, engine.Completed, got.Status, "a replay with a MaxInt64 TTL")
			}
		})
	}
}
