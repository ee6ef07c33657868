package webhook_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/webhook"
)

// gatedStore holds every Complete until gate is closed or its context
// ends, as a store that stopped answering writes would.
type gatedStore struct {
	engine.Store
	gate chan struct{}
}

func (s *gatedStore) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	select {
	case <-s.gate:
		return s.Store.Complete(ctx, id, token, resp, ttl)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestAnsweredWhileStoredOnItsGoroutine: after Shutdown, a result
// whose store write failed is stored on the request's goroutine; the
// sender gets the whole answer at once, not when the store write ends.
func TestAnsweredWhileStoredOnItsGoroutine(t *testing.T) {
	store := &gatedStore{Store: teststores.Memory(t), gate: make(chan struct{})}
	rc, err := webhook.New(store, webhook.StandardWebhooks(standardSecret),
		webhook.WithConfig(engine.Config{StoreTimeout: 50 * time.Millisecond, Lease: time.Minute}))
	require.NoError(t, err)
	require.NoError(t, rc.Shutdown(context.Background()))
	var e effects
	url := serve(t, rc, counting(&e))

	answers := make(chan answer, 1)
	go func() {
		req := standardRequest(t, url, "msg_now", payload)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answers <- answer{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answers <- answer{status: resp.StatusCode, body: string(b), header: resp.Header}
	}()
	var a answer
	select {
	case a = <-answers:
	case <-time.After(10 * time.Second):
		close(store.gate)
		<-answers
		t.Fatal("the sender was not answered while the store write went on")
	}
	close(store.gate)
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, "done", a.body)
	require.Eventually(t, func() bool {
		again := deliver(t, url, "msg_now", payload)
		return again.status == http.StatusOK && again.replayed
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, e.of("msg_now"))
}
