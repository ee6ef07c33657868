package idempotency_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

// observed collects what a Client's observer is told.
type observed struct {
	mu  sync.Mutex
	all []idempotency.Event
	// then, if set, is called with each event after it is kept.
	then func(idempotency.Event)
}

func (o *observed) observe(_ context.Context, e idempotency.Event) {
	o.mu.Lock()
	o.all = append(o.all, e)
	then := o.then
	o.mu.Unlock()
	if then != nil {
		then(e)
	}
}

func (o *observed) events() []idempotency.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]idempotency.Event(nil), o.all...)
}

func kinds(events []idempotency.Event) []idempotency.EventKind {
	out := make([]idempotency.EventKind, len(events))
	for i, e := range events {
		out[i] = e.Kind
	}
	return out
}

// TestEvents: every attempt yields one event, the last one a final kind that
// says how the call ended, through real loopback requests.
func TestEvents(t *testing.T) {
	stall := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	noRetry := func(*http.Response, error) bool { return false }
	tests := []struct {
		name   string
		steps  []http.HandlerFunc
		opts   []idempotency.Option
		want   []idempotency.EventKind
		result []string
		status []int
		budget []int
		// stopped is the final event's Stopped.
		stopped error
		// response reports whether Do returns one.
		response bool
	}{
		{
			name:   "completed",
			steps:  []http.HandlerFunc{status(http.StatusCreated)},
			want:   []idempotency.EventKind{idempotency.EventCompleted},
			result: []string{"response"},
			status: []int{201}, budget: []int{500}, response: true,
		},
		{
			name:   "retried then completed",
			steps:  []http.HandlerFunc{lost, status(http.StatusServiceUnavailable), status(http.StatusCreated)},
			want:   []idempotency.EventKind{idempotency.EventRetried, idempotency.EventRetried, idempotency.EventCompleted},
			result: []string{"transport_error", "response", "response"},
			// Each retry costs 5 tokens; the success gives them back.
			status: []int{0, 503, 201}, budget: []int{495, 490, 500}, response: true,
		},
		{
			name:   "replayed",
			steps:  []http.HandlerFunc{status(http.StatusCreated, hdrReplayed, "true")},
			want:   []idempotency.EventKind{idempotency.EventReplayed},
			result: []string{"response"},
			status: []int{201}, budget: []int{500}, response: true,
		},
		{
			name:   "gave up: attempts",
			steps:  []http.HandlerFunc{status(http.StatusConflict, "Retry-After", "0")},
			opts:   []idempotency.Option{idempotency.WithMaxAttempts(2)},
			want:   []idempotency.EventKind{idempotency.EventRetried, idempotency.EventGaveUp},
			result: []string{"response", "response"},
			status: []int{409, 409}, budget: []int{495, 495}, stopped: idempotency.ErrAttemptsExhausted, response: true,
		},
		{
			name:   "gave up: budget",
			steps:  []http.HandlerFunc{status(http.StatusServiceUnavailable)},
			opts:   []idempotency.Option{idempotency.WithBudget(idempotency.NewBudget(5))},
			want:   []idempotency.EventKind{idempotency.EventRetried, idempotency.EventGaveUp},
			result: []string{"response", "response"},
			status: []int{503, 503}, budget: []int{0, 0}, stopped: idempotency.ErrBudgetExhausted, response: true,
		},
		{
			name:   "gave up: not keyed",
			steps:  []http.HandlerFunc{status(http.StatusServiceUnavailable)},
			opts:   []idempotency.Option{idempotency.WithMethods(http.MethodPatch), idempotency.WithBudget(nil)},
			want:   []idempotency.EventKind{idempotency.EventGaveUp},
			result: []string{"response"},
			status: []int{503}, budget: []int{-1}, stopped: idempotency.ErrNotIdempotent, response: true,
		},
		{
			name:   "timeout, then completed",
			steps:  []http.HandlerFunc{stall, status(http.StatusCreated)},
			opts:   []idempotency.Option{idempotency.WithAttemptTimeout(100 * time.Millisecond)},
			want:   []idempotency.EventKind{idempotency.EventRetried, idempotency.EventCompleted},
			result: []string{"timeout", "response"},
			// A retry after a timeout costs 10.
			status: []int{0, 201}, budget: []int{490, 500}, response: true,
		},
		{
			name:   "failed",
			steps:  []http.HandlerFunc{lost},
			opts:   []idempotency.Option{idempotency.WithRetryPolicy(noRetry)},
			want:   []idempotency.EventKind{idempotency.EventFailed},
			result: []string{"transport_error"},
			status: []int{0}, budget: []int{500},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, newScript(tt.steps...))
			var o observed
			c := newClient(t, srv, append([]idempotency.Option{idempotency.WithObserver(o.observe)}, tt.opts...)...)
			before := time.Now()
			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			if tt.response {
				require.NoError(t, err)
				resp.Body.Close()
			} else {
				require.Error(t, err)
			}
			got := o.events()
			require.Equal(t, tt.want, kinds(got))
			last := got[len(got)-1]
			for i, e := range got {
				assert.Equal(t, i+1, e.Attempt, "event %d: Attempt", i)
				assert.Equal(t, tt.result[i], resultOf(e), "event %d: result", i)
				assert.Equal(t, tt.status[i], e.StatusCode, "event %d: StatusCode", i)
				assert.Equal(t, tt.budget[i], e.Budget, "event %d: Budget", i)
				assert.Equal(t, http.MethodPost, e.Method)
				assert.Equal(t, got[0].Call, e.Call, "event %d: Call", i)
				assert.Equal(t, got[0].Key, e.Key, "event %d: Key", i)
				assert.Equal(t, tt.stopped != idempotency.ErrNotIdempotent, e.Key != "", "event %d: Key %q", i, e.Key)
				assert.False(t, e.Start.Before(before), "event %d: Start before the call", i)
				assert.False(t, e.Sent.Before(e.Start), "event %d: Sent before Start", i)
				assert.Positive(t, e.Took, "event %d: Took", i)
				assert.GreaterOrEqual(t, e.Elapsed, e.Sent.Sub(e.Start)+e.Took, "event %d: Elapsed", i)
				assert.Equal(t, e.StatusCode == 0, e.Err != nil, "event %d: Err %v with status %d", i, e.Err, e.StatusCode)
				if e.Kind == idempotency.EventRetried {
					assert.GreaterOrEqual(t, e.Wait, time.Duration(0))
				} else {
					assert.Zero(t, e.Wait, "event %d: Wait", i)
				}
				if i > 0 {
					assert.True(t, e.Sent.After(got[i-1].Sent), "event %d: Sent not after the previous attempt's", i)
				}
			}
			if tt.stopped != nil {
				assert.ErrorIs(t, last.Stopped, tt.stopped)
			} else {
				assert.NoError(t, last.Stopped)
			}
			if tt.response {
				out := outcome(t, resp)
				assert.Equal(t, last.Kind, out.Kind, "Outcome.Kind %s, want %s", out.Kind, last.Kind)
				assert.Equal(t, last.Key, out.Key)
				assert.Equal(t, last.Replayed, out.Replayed)
			}

			// Another call has another number.
			resp, err = c.Do(post(t, t.Context(), srv.URL, "x"))
			if err == nil {
				resp.Body.Close()
			}
			again := o.events()[len(got):]
			require.NotEmpty(t, again)
			assert.NotEqual(t, got[0].Call, again[0].Call)
		})
	}
}

// TestEventsCanceled: a call whose context ends ends with EventCanceled,
// during an attempt or during the wait for the next one.
func TestEventsCanceled(t *testing.T) {
	t.Run("during the wait", func(t *testing.T) {
		srv := newServer(t, newScript(status(http.StatusServiceUnavailable, "Retry-After", "20")))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		o := observed{then: func(e idempotency.Event) {
			if e.Kind == idempotency.EventRetried {
				cancel()
			}
		}}
		c := newClient(t, srv, idempotency.WithObserver(o.observe))
		_, err := c.Do(post(t, ctx, srv.URL, "x"))
		require.ErrorIs(t, err, context.Canceled)
		got := o.events()
		require.Equal(t, []idempotency.EventKind{idempotency.EventRetried, idempotency.EventCanceled}, kinds(got))
		assert.Equal(t, 20*time.Second, got[0].Wait)
		e := got[1]
		assert.Equal(t, 1, e.Attempt, "no second attempt was made")
		assert.True(t, e.Sent.IsZero(), "Sent of a wait")
		assert.Zero(t, e.Took)
		assert.Zero(t, e.StatusCode)
		assert.Equal(t, "canceled", resultOf(e))
		assert.ErrorIs(t, e.Err, context.Canceled)
	})
	t.Run("during an attempt", func(t *testing.T) {
		arrived := make(chan struct{})
		srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Once the body is read, the server notices the client leave.
			io.Copy(io.Discard, r.Body)
			close(arrived)
			<-r.Context().Done()
		}))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			<-arrived
			cancel()
		}()
		var o observed
		c := newClient(t, srv, idempotency.WithObserver(o.observe))
		_, err := c.Do(post(t, ctx, srv.URL, "x"))
		require.ErrorIs(t, err, context.Canceled)
		got := o.events()
		require.Equal(t, []idempotency.EventKind{idempotency.EventCanceled}, kinds(got))
		assert.Equal(t, "canceled", resultOf(got[0]))
		assert.False(t, got[0].Sent.IsZero())
	})
}

// TestEventsNoneBeforeAnAttempt: a call refused before its first attempt
// tells the observer nothing.
func TestEventsNoneBeforeAnAttempt(t *testing.T) {
	var o observed
	c := clienttest.New(t, idempotency.WithObserver(o.observe))
	_, err := c.Post(t.Context(), "/relative", "text/plain", nil)
	require.ErrorIs(t, err, idempotency.ErrInvalidURL)
	assert.Empty(t, o.events())
}

func TestEventKindString(t *testing.T) {
	for k, want := range map[idempotency.EventKind]string{
		idempotency.EventRetried: "retried", idempotency.EventCompleted: "completed",
		idempotency.EventReplayed: "replayed", idempotency.EventGaveUp: "gave_up",
		idempotency.EventFailed: "failed", idempotency.EventCanceled: "canceled", 0: "unknown", 99: "unknown",
	} {
		assert.Equal(t, want, k.String())
	}
}

// resultOf says what the attempt of e got, from its error, as an observer
// tells it: "response", "timeout", "canceled" or "transport_error".
func resultOf(e idempotency.Event) string {
	var timeout interface{ Timeout() bool }
	switch {
	case e.Err == nil:
		return "response"
	case errors.Is(e.Err, idempotency.ErrAttemptTimeout):
		return "timeout"
	case errors.Is(e.Err, context.Canceled), errors.Is(e.Err, context.DeadlineExceeded):
		return "canceled"
	case errors.As(e.Err, &timeout) && timeout.Timeout():
		return "timeout"
	}
	return "transport_error"
}
