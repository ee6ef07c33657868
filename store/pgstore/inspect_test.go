package pgstore_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
)

// A lease of a nanosecond ends at once, so each Claim of the same request
// takes the previous one over, and counts the holder it replaced.
func TestClaimCountsAbandonedHolders(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t))
	id := scopeID("abandoned")
	for want := range 3 {
		c, err := s.Claim(ctx, id, "fp", time.Nanosecond, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status, "claim %d", want)
		assert.Equal(t, want, c.Abandoned, "claim %d", want)
	}
	other, err := s.Claim(ctx, id, "another request", time.Nanosecond, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.InFlight, other.Status, "another request on an abandoned lease")
	assert.Zero(t, other.RetryAfter)

	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, 3, c.Abandoned)
	// A release by a holder that took the record over keeps the count
	// of the holders lost before it.
	require.NoError(t, s.Release(ctx, id, c.Token))
	c, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status)
	assert.Equal(t, 3, c.Abandoned, "after a release")

	// An expired record starts again at 0.
	expired := scopeID("abandoned-then-expired")
	for range 2 {
		_, err := s.Claim(ctx, expired, "fp", time.Nanosecond, time.Nanosecond)
		require.NoError(t, err)
	}
	c, err = s.Claim(ctx, expired, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status)
	assert.Zero(t, c.Abandoned, "after the record expired")
}

func TestLookup(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t))
	id := scopeID("looked-up")

	_, err := s.Lookup(ctx, id)
	assert.ErrorIs(t, err, engine.ErrNotFound, "never claimed")

	first, err := s.Claim(ctx, id, "fp", time.Nanosecond, time.Hour)
	require.NoError(t, err)
	firstRec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	c, err := s.Claim(ctx, id, "fp", time.Hour, 2*time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, c.Abandoned)

	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, id, rec.ID)
	assert.False(t, rec.Completed)
	assert.Equal(t, "fp", rec.Fingerprint)
	assert.Equal(t, c.Token, rec.Token)
	assert.Greater(t, rec.Token, first.Token)
	assert.Equal(t, 1, rec.Abandoned)
	assert.Equal(t, firstRec.Created, rec.Created, "Created is the first claim's")
	assert.False(t, firstRec.LeaseEnds.After(firstRec.Created), "a nanosecond lease ends when it starts")
	assert.InDelta(t, time.Hour.Seconds(), rec.LeaseEnds.Sub(rec.Created).Seconds(), 60)
	// The record outlives the lease by the TTL.
	assert.InDelta(t, (3 * time.Hour).Seconds(), rec.Expires.Sub(rec.Created).Seconds(), 60)
	assert.Nil(t, rec.Response)

	resp := created(`{"id":1}`)
	require.NoError(t, s.Complete(ctx, id, c.Token, resp, time.Hour))
	rec, err = s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.True(t, rec.Completed)
	assert.Equal(t, resp, rec.Response)
	assert.True(t, rec.LeaseEnds.IsZero(), "LeaseEnds of a completed record")

	released := scopeID("released")
	require.NoError(t, s.Release(ctx, released, acquire(t, ctx, s, released, "fp")))
	_, err = s.Lookup(ctx, released)
	assert.ErrorIs(t, err, engine.ErrNotFound, "released")

	expired := scopeID("expired")
	_, err = s.Claim(ctx, expired, "fp", time.Nanosecond, time.Nanosecond)
	require.NoError(t, err)
	_, err = s.Lookup(ctx, expired)
	assert.ErrorIs(t, err, engine.ErrNotFound, "expired")
}

func TestResolve(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t))
	unknown := &engine.Response{Status: http.StatusInternalServerError, Header: http.Header{"X-Outcome": {"unknown"}}}

	for _, tc := range []struct {
		name      string
		completed bool // complete the record before resolving it
		resp      *engine.Response
	}{
		{"in flight, recorded as done", false, unknown},
		{"in flight, forgotten", false, nil},
		{"completed, replaced", true, unknown},
		{"completed, forgotten", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := scopeID("resolve " + tc.name)
			require.ErrorIs(t, s.Resolve(ctx, id, tc.resp, time.Hour), engine.ErrNotFound, "before any claim")
			tok := acquire(t, ctx, s, id, "fp")
			if tc.completed {
				require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
			}
			require.NoError(t, s.Resolve(ctx, id, tc.resp, time.Hour))

			assert.ErrorIs(t, s.Extend(ctx, id, tok, time.Minute), engine.ErrLeaseLost)
			assert.ErrorIs(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour), engine.ErrLeaseLost)
			assert.ErrorIs(t, s.Release(ctx, id, tok), engine.ErrLeaseLost)
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			if tc.resp == nil {
				assert.Equal(t, engine.Acquired, c.Status)
				assert.Zero(t, c.Abandoned)
				assert.Greater(t, c.Token, tok)
				return
			}
			assert.Equal(t, engine.Completed, c.Status)
			assert.Equal(t, tc.resp, c.Response)
			rec, err := s.Lookup(ctx, id)
			require.NoError(t, err)
			assert.True(t, rec.Completed)
			assert.Equal(t, tc.resp, rec.Response)
		})
	}

	expired := scopeID("resolve expired")
	_, err := s.Claim(ctx, expired, "fp", time.Nanosecond, time.Nanosecond)
	require.NoError(t, err)
	assert.ErrorIs(t, s.Resolve(ctx, expired, unknown, time.Hour), engine.ErrNotFound)
	assert.ErrorIs(t, s.Resolve(ctx, expired, nil, time.Hour), engine.ErrNotFound)
}

// In transactional mode a request being served is invisible: its record
// commits with its response. Resolve settles what has committed.
func TestTxLookupResolve(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t), pgstore.WithTransactions())
	id := scopeID("tx-inspected")
	tok := acquire(t, ctx, s, id, "fp")
	_, err := s.Lookup(ctx, id)
	assert.ErrorIs(t, err, engine.ErrNotFound, "in flight")
	assert.ErrorIs(t, s.Resolve(ctx, id, nil, time.Hour), engine.ErrNotFound, "in flight")
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))

	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.True(t, rec.Completed)
	assert.Equal(t, tok, rec.Token)
	assert.Equal(t, created(`{}`), rec.Response)

	require.NoError(t, s.Resolve(ctx, id, nil, time.Hour))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status, "after Resolve forgot the record")
	require.NoError(t, s.Release(ctx, id, c.Token))
}
