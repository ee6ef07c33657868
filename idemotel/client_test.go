package idemotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemotel"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

// scripted is an endpoint that answers its requests with the given
// statuses in turn, the last one for every request after them; a status of
// 0 closes the connection without an answer, and -1 never answers.
func scripted(t *testing.T, statuses ...int) string {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		i := int(n.Add(1)) - 1
		code := statuses[min(i, len(statuses)-1)]
		switch code {
		case 0:
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		case -1:
			<-r.Context().Done()
			return
		case 299:
			// A replay.
			w.Header().Set(idempotency.HeaderReplayed, "true")
			code = http.StatusCreated
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func newClient(t *testing.T, tm *telemetry, opts ...idempotency.Option) *idempotency.Client {
	t.Helper()
	observe, err := idemotel.ClientObserver(tm.options()...)
	require.NoError(t, err)
	return clienttest.New(t, append([]idempotency.Option{
		idempotency.WithObserver(observe),
		idempotency.WithBackoff(time.Millisecond, 5*time.Millisecond),
		idempotency.WithAttemptTimeout(200 * time.Millisecond),
	}, opts...)...)
}

var (
	method     = attribute.String("http.request.method", "POST")
	stopReason = attribute.Key("idempotency.stop_reason").String
)

// TestClientOutcomes: each way an operation can end, through real loopback
// requests, is counted with its attempts and retries, and recorded as an
// operation span with a child span for each attempt.
func TestClientOutcomes(t *testing.T) {
	tests := []struct {
		name     string
		statuses []int
		opts     []idempotency.Option
		outcome  string
		attempts int
		// retries are the error.type of each retry.
		retries []string
		// final are the attributes of the operation, besides its outcome.
		final  []attribute.KeyValue
		budget int64
		failed bool
	}{
		{name: "completed", statuses: []int{201}, outcome: "completed", attempts: 1,
			final: []attribute.KeyValue{status(201)}, budget: 500},
		{name: "replayed", statuses: []int{299}, outcome: "replayed", attempts: 1,
			final: []attribute.KeyValue{status(201)}, budget: 500},
		{name: "completed after retries", statuses: []int{0, 503, -1, 201}, outcome: "completed", attempts: 4,
			retries: []string{"transport_error", "503", "timeout"},
			final:   []attribute.KeyValue{status(201)}, budget: 500},
		{name: "unprocessable", statuses: []int{422}, outcome: "completed", attempts: 1,
			final: []attribute.KeyValue{status(422), errType("422")}, budget: 500},
		{name: "gave up: attempts", statuses: []int{503}, opts: []idempotency.Option{idempotency.WithMaxAttempts(3)},
			outcome: "gave_up", attempts: 3, retries: []string{"503", "503"},
			final: []attribute.KeyValue{status(503), errType("503"), stopReason("attempts_exhausted")}, budget: 490},
		{name: "gave up: budget", statuses: []int{503}, opts: []idempotency.Option{idempotency.WithBudget(idempotency.NewBudget(7))},
			outcome: "gave_up", attempts: 2, retries: []string{"503"},
			final: []attribute.KeyValue{status(503), stopReason("budget_exhausted")}, budget: 2},
		{name: "failed", statuses: []int{0}, opts: []idempotency.Option{idempotency.WithRetryPolicy(func(*http.Response, error) bool { return false })},
			outcome: "failed", attempts: 1, final: []attribute.KeyValue{errType("transport_error")}, budget: 500, failed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm := newTelemetry(t)
			c := newClient(t, tm, tt.opts...)
			resp, err := c.Post(t.Context(), scripted(t, tt.statuses...), "text/plain", strings.NewReader("x"))
			if tt.failed {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
				resp.Body.Close()
			}

			m := tm.collect(t)
			ops := m["idempotency.client.operations"]
			want := append([]attribute.KeyValue{method, outcome(tt.outcome)}, tt.final...)
			assert.Equal(t, int64(1), sum(t, ops, want...), "operations with %v", want)
			assert.Equal(t, int64(1), sum(t, ops))
			assert.Equal(t, uint64(1), count(t, m["idempotency.client.operation.attempts"], outcome(tt.outcome)))
			assert.Equal(t, uint64(1), count(t, m["idempotency.client.operation.duration"], outcome(tt.outcome)))
			assert.Equal(t, int64(tt.attempts), histSum(t, m["idempotency.client.operation.attempts"]), "attempts per operation")

			assert.Equal(t, int64(tt.attempts), sum(t, m["idempotency.client.attempts"], method))
			assert.Equal(t, uint64(tt.attempts), count(t, m["idempotency.client.attempt.duration"], method))
			assert.Equal(t, int64(len(tt.retries)), sum(t, m["idempotency.client.retries"]))
			for _, reason := range tt.retries {
				n := int64(0)
				for _, r := range tt.retries {
					if r == reason {
						n++
					}
				}
				assert.Equal(t, n, sum(t, m["idempotency.client.retries"], method, errType(reason)), "retries for %s", reason)
			}
			assert.Equal(t, tt.budget, gauge(t, m["idempotency.client.retry_budget.available"]))

			spans := tm.spansNamed("idempotency.operation", outcome(tt.outcome), attribute.Key("idempotency.attempts").Int(tt.attempts))
			require.Len(t, spans, 1)
			op := spans[0]
			kids := tm.children(op)
			require.Len(t, kids, tt.attempts)
			for _, k := range kids {
				assert.Equal(t, "idempotency.attempt", k)
			}
			attempts := tm.spansNamed("idempotency.attempt")
			for _, a := range attempts {
				assert.False(t, a.StartTime().Before(op.StartTime()), "an attempt starts before its operation")
				assert.False(t, a.EndTime().After(op.EndTime()), "an attempt ends after its operation")
			}
			if tt.attempts > 1 {
				assert.Len(t, tm.spansNamed("idempotency.attempt", attribute.Int("http.request.resend_count", tt.attempts-1)), 1)
			}
			if tt.outcome == "gave_up" || tt.outcome == "failed" {
				assert.Equal(t, codes.Error, op.Status().Code)
			} else {
				assert.Equal(t, codes.Unset, op.Status().Code)
			}
			set := attribute.NewSet(op.Attributes()...)
			_, hasKey := set.Value(attribute.Key("idempotency.key"))
			assert.False(t, hasKey, "the key is never on a span")
		})
	}
}

// TestClientCanceled: an operation whose context ends while it waits to
// retry is counted as canceled, its span ended with its one attempt.
func TestClientCanceled(t *testing.T) {
	tm := newTelemetry(t)
	observe, err := idemotel.ClientObserver(tm.options()...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := clienttest.New(t, idempotency.WithObserver(func(ctx context.Context, e idempotency.Event) {
		observe(ctx, e)
		if e.Kind == idempotency.EventRetried {
			cancel()
		}
	}), idempotency.WithBackoff(time.Hour, time.Hour))
	ctx = idempotency.ContextWithKey(ctx, "order-7")
	_, err = c.Post(ctx, scripted(t, 503), "text/plain", strings.NewReader("x"))
	require.ErrorIs(t, err, context.Canceled)

	m := tm.collect(t)
	assert.Equal(t, int64(1), sum(t, m["idempotency.client.operations"], outcome("canceled"), errType("canceled")))
	assert.Equal(t, int64(1), sum(t, m["idempotency.client.attempts"]), "one attempt")
	spans := tm.spansNamed("idempotency.operation", outcome("canceled"))
	require.Len(t, spans, 1)
	assert.Equal(t, []string{"idempotency.attempt"}, tm.children(spans[0]))
}
