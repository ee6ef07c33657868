package idemotel

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

// TestClientSpansForgotten: the span of an operation that retried is kept
// only until its final event, whatever the outcome.
func TestClientSpansForgotten(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	cfg, err := newConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	o := &clientObserver{cfg: cfg, spans: make(map[callID]callSpan)}
	// The global TracerProvider's spans record nothing, and are kept all
	// the same.
	o.tracer = o.cfg.tracer()
	sawKept := false
	c := clienttest.New(t, idempotency.WithBackoff(time.Millisecond, time.Millisecond),
		idempotency.WithObserver(func(ctx context.Context, e idempotency.Event) {
			o.span(ctx, e, "", func() []attribute.KeyValue { return nil })
			o.mu.Lock()
			sawKept = sawKept || len(o.spans) > 0
			o.mu.Unlock()
		}))
	for range 5 {
		resp, err := c.Post(t.Context(), srv.URL, "text/plain", strings.NewReader("x"))
		require.NoError(t, err)
		resp.Body.Close()
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = c.Post(ctx, srv.URL, "text/plain", strings.NewReader("x"))
	require.Error(t, err)
	assert.True(t, sawKept, "a retrying operation's span was kept")
	assert.Empty(t, o.spans)
}
