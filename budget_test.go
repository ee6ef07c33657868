package idempotency_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
)

func TestBudgetExhausted(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable))
	srv := newServer(t, s)
	b := idempotency.NewBudget(10) // two retries
	c := newClient(t, srv, idempotency.WithBudget(b), idempotency.WithMaxAttempts(10))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o := outcome(t, resp)
	assert.Equal(t, 3, o.Attempts)
	assert.ErrorIs(t, o.Stopped, idempotency.ErrBudgetExhausted)
	assert.Zero(t, idempotency.Available(b))

	// With the budget empty, nothing is retried.
	resp, err = c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o = outcome(t, resp)
	assert.Equal(t, 1, o.Attempts)
	assert.ErrorIs(t, o.Stopped, idempotency.ErrBudgetExhausted)
	assert.EqualValues(t, 4, s.hits.Load())

	// Not even a lost response, which then has no response to return.
	s.set(0, lost)
	_, err = c.Do(post(t, t.Context(), srv.URL, "x"))
	assert.ErrorIs(t, err, idempotency.ErrBudgetExhausted)

	// A success on the first attempt puts a token back.
	s.set(0, status(http.StatusCreated))
	resp, err = c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 1, idempotency.Available(b))
}

func TestBudgetRefundAfterRetries(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable), status(http.StatusServiceUnavailable), status(http.StatusCreated))
	srv := newServer(t, s)
	b := idempotency.NewBudget(20)
	c := newClient(t, srv, idempotency.WithBudget(b))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 3, outcome(t, resp).Attempts)
	assert.Equal(t, 20, idempotency.Available(b), "Available() after a success that took two retries")
}

func TestBudgetTimeoutCostsMore(t *testing.T) {
	srv := newServer(t, &keyServer{delay: 100})
	b := idempotency.NewBudget(15)
	c := newClient(t, srv, idempotency.WithBudget(b), idempotency.WithAttemptTimeout(20*time.Millisecond))

	_, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.Error(t, err)
	var re *idempotency.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 2, re.Attempts)
	assert.ErrorIs(t, err, idempotency.ErrBudgetExhausted)
	assert.ErrorIs(t, err, idempotency.ErrAttemptTimeout)
	assert.Equal(t, 5, idempotency.Available(b))
}

func TestBudgetShared(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusServiceUnavailable)))
	b := idempotency.NewBudget(500)
	c1 := newClient(t, srv, idempotency.WithBudget(b), idempotency.WithMaxAttempts(2))
	c2 := newClient(t, srv, idempotency.WithBudget(b), idempotency.WithMaxAttempts(3))

	for _, c := range []*idempotency.Client{c1, c2} {
		resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
	}
	assert.Equal(t, 500-3*5, idempotency.Available(b))
	assert.Equal(t, 500, idempotency.Capacity(b))
}

func TestBudgetOff(t *testing.T) {
	// WithoutBudget wins over a budget given before it.
	for _, opts := range [][]idempotency.Option{
		{idempotency.WithBudget(nil)},
		{idempotency.WithBudget(idempotency.NewBudget(1)), idempotency.WithBudget(nil)},
	} {
		s := newScript(status(http.StatusServiceUnavailable))
		srv := newServer(t, s)
		c := newClient(t, srv, append(opts, idempotency.WithMaxAttempts(5))...)

		resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		o := outcome(t, resp)
		assert.Equal(t, 5, o.Attempts)
		assert.ErrorIs(t, o.Stopped, idempotency.ErrAttemptsExhausted)
	}
}

func TestBudgetZero(t *testing.T) {
	assert.Zero(t, idempotency.Capacity(idempotency.NewBudget(-1)))
	var zero idempotency.Budget
	assert.Zero(t, idempotency.Available(&zero))

	srv := newServer(t, newScript(status(http.StatusServiceUnavailable)))
	c := newClient(t, srv, idempotency.WithBudget(&zero))
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.ErrorIs(t, outcome(t, resp).Stopped, idempotency.ErrBudgetExhausted)
}
