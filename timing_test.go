package idempotency_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
)

// maxRand makes the backoff's full jitter always pick the largest wait.
func maxRand(n int64) int64 { return n - 1 }

func TestRetryAfter(t *testing.T) {
	const backoff = 40 * time.Millisecond // what the wait is without a usable Retry-After
	tests := []struct {
		name     string
		code     int
		value    string
		maxAfter time.Duration
		want     time.Duration
	}{
		{"503 delta-seconds clamped", 503, "1", 50 * time.Millisecond, 50 * time.Millisecond},
		{"503 HTTP-date clamped", 503, time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), 50 * time.Millisecond, 50 * time.Millisecond},
		{"503 HTTP-date in the past", 503, time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), time.Second, 0},
		{"503 HTTP-date in RFC 850 form", 503, time.Now().Add(time.Hour).UTC().Format(time.RFC850), 50 * time.Millisecond, 50 * time.Millisecond},
		{"429 delta-seconds zero", 429, "0", time.Second, 0},
		{"429 huge delta-seconds clamped", 429, "99999999999999999999999", 50 * time.Millisecond, 50 * time.Millisecond},
		{"409 delta-seconds clamped", 409, "3", 50 * time.Millisecond, 50 * time.Millisecond},
		{"negative ignored", 503, "-5", time.Second, backoff},
		{"garbage ignored", 503, "soon", time.Second, backoff},
		{"no header", 503, "", time.Second, backoff},
		{"limit 0 ignores the header", 503, "0", 0, backoff},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var header []string
			if tt.value != "" {
				header = []string{"Retry-After", tt.value}
			}
			srv := newServer(t, newScript(status(tt.code, header...), status(http.StatusCreated)))
			var r retries
			c := newClient(t, srv, idempotency.WithMaxRetryAfter(tt.maxAfter), idempotency.WithRand(maxRand),
				idempotency.WithBackoff(backoff, backoff), idempotency.WithObserver(r.hook))

			start := time.Now()
			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			infos := r.all()
			require.Len(t, infos, 1)
			assert.Equal(t, tt.want, infos[0].Wait, "Event.Wait")
			assert.Equal(t, tt.code, infos[0].StatusCode, "Event.StatusCode")
			assert.GreaterOrEqual(t, time.Since(start), tt.want, "time taken")
		})
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	// The one test that really waits for a Retry-After: one second.
	srv := newServer(t, newScript(status(http.StatusServiceUnavailable, "Retry-After", "1"), status(http.StatusCreated)))
	var r retries
	c := newClient(t, srv, idempotency.WithObserver(r.hook))

	start := time.Now()
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.GreaterOrEqual(t, time.Since(start), time.Second)
	require.Len(t, r.all(), 1)
	assert.Equal(t, time.Second, r.all()[0].Wait)
}

func TestBackoffWaits(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusServiceUnavailable)))
	var r retries
	c := newClient(t, srv, idempotency.WithRand(maxRand), idempotency.WithBackoff(2*time.Millisecond, 10*time.Millisecond),
		idempotency.WithMaxAttempts(6), idempotency.WithObserver(r.hook))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	var waits []time.Duration
	for i, info := range r.all() {
		assert.Equal(t, i+1, info.Attempt)
		waits = append(waits, info.Wait)
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{2 * ms, 4 * ms, 8 * ms, 10 * ms, 10 * ms}, waits)
}

func TestCancelDuringBackoff(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable, "Retry-After", "10"))
	srv := newServer(t, s)
	waiting := make(chan struct{})
	c := newClient(t, srv, onRetry(func() { close(waiting) }))
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-waiting
		cancel()
	}()

	start := time.Now()
	resp, err := c.Do(post(t, ctx, srv.URL, "x"))
	elapsed := time.Since(start)
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, context.Canceled)
	var re *idempotency.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Attempts)
	assert.NotEmpty(t, re.Key)
	assert.Less(t, elapsed, 2*time.Second, "Do returned after %v of a 10s wait", elapsed)
	assert.EqualValues(t, 1, s.hits.Load())
}

func TestDeadlineBeforeNextAttempt(t *testing.T) {
	tests := []struct {
		name string
		wait []idempotency.Option
		step http.HandlerFunc
	}{
		{"Retry-After", nil, status(http.StatusServiceUnavailable, "Retry-After", "10")},
		{"backoff", []idempotency.Option{idempotency.WithBackoff(10*time.Second, 10*time.Second), idempotency.WithRand(maxRand)},
			status(http.StatusServiceUnavailable)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(tt.step, status(http.StatusCreated))
			srv := newServer(t, s)
			c := newClient(t, srv, tt.wait...)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()

			start := time.Now()
			resp, err := c.Do(post(t, ctx, srv.URL, "x"))
			elapsed := time.Since(start)
			require.NoError(t, err)
			assert.Equal(t, "status 503", readAll(t, resp), "the last response")
			o := outcome(t, resp)
			assert.Equal(t, 1, o.Attempts)
			assert.ErrorIs(t, o.Stopped, idempotency.ErrDeadline)
			assert.Less(t, elapsed, time.Second, "Do returned after %v, want at once", elapsed)
		})
	}
}

func TestCallerCancellationNotRetried(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration // 0: cancel once the request arrived
		want    error
	}{
		{"cancel", 0, context.Canceled},
		{"deadline", 50 * time.Millisecond, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			s := newScript(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				<-r.Context().Done()
			})
			srv := newServer(t, s)
			// A policy that retries everything cannot overrule the caller.
			c := newClient(t, srv, idempotency.WithRetryPolicy(func(*http.Response, error) bool { return true }))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			} else {
				go func() {
					<-arrived
					cancel()
				}()
			}

			resp, err := c.Do(post(t, ctx, srv.URL, "x"))
			assert.Nil(t, resp)
			assert.ErrorIs(t, err, tt.want)
			var re *idempotency.RetryError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, 1, re.Attempts)
			if tt.timeout > 0 {
				// On a busy machine the deadline may pass before the
				// request arrives; it is never sent twice.
				assert.LessOrEqual(t, s.hits.Load(), int64(1))
			} else {
				assert.EqualValues(t, 1, s.hits.Load())
			}
		})
	}
}

func TestCustomPolicy(t *testing.T) {
	s := newScript(status(http.StatusNotFound), status(http.StatusOK))
	srv := newServer(t, s)
	c := newClient(t, srv, idempotency.WithRetryPolicy(func(resp *http.Response, err error) bool {
		return resp != nil && resp.StatusCode == http.StatusNotFound || idempotency.DefaultPolicy(resp, err)
	}))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2, outcome(t, resp).Attempts)
}
