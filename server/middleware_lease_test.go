package server_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestLeaseFromContext(t *testing.T) {
	leases := make(chan engine.Lease, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, ok := engine.LeaseFromContext(r.Context())
		if ok {
			leases <- l
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv, _ := fixture(t, h, server.WithScope(func(*http.Request) (string, error) { return "acme", nil }))
	post(t, srv.URL, `"quoted-key"`, "x")
	l := <-leases
	assert.Equal(t, "acme", l.Scope)
	assert.Equal(t, "quoted-key", l.Key)
	assert.Positive(t, int64(l.Token))
	_, ok := engine.LeaseFromContext(context.Background())
	assert.False(t, ok)
}

// TestLeaseRenewed shows that a handler that outlives its lease keeps it:
// duplicates sent over several lease lengths are refused, never run.
func TestLeaseRenewed(t *testing.T) {
	// Long enough that a renewal delayed by a busy machine still comes
	// before the lease's end.
	const lease = time.Second
	h := newBlocking()
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Lease: lease}))
	first := postAsync(srv.URL, "k", "x")
	<-h.started
	// A duplicate that ran would block in the handler: give up on it
	// rather than hang.
	client := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	for n := 0; time.Since(start) < 2*lease || n < 3; n++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := client.Do(req)
		require.NoError(t, err, "a duplicate ran the handler after %v", time.Since(start))
		resp.Body.Close()
		require.Equal(t, http.StatusConflict, resp.StatusCode)
	}
	close(h.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, int64(1), h.executions.Load())
}

func TestLeaseLostCancelsHandler(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	causes := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		causes <- context.Cause(r.Context())
		w.WriteHeader(http.StatusCreated)
	})
	// A lease long enough that a Claim slowed by a busy machine still
	// leaves the handler time to start; the first renewal, after a third
	// of it, finds the lease lost.
	srv := fixtureWith(t, losing{store}, h, server.WithConfig(engine.Config{Lease: 600 * time.Millisecond}))
	post(t, srv.URL, "k", "x")
	assert.ErrorIs(t, recv(t, causes, "the handler's cancellation"), engine.ErrLeaseLost)
}

// binding is a Store that hands the handler a value through Bind.
type binding struct{ memstore.Store }

type bound struct{}

func (binding) Bind(ctx context.Context, id engine.ID, tok engine.Token) context.Context {
	return context.WithValue(ctx, bound{}, id.Key+"#"+strconv.FormatInt(int64(tok), 10))
}

func TestBinder(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	got := make(chan any, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Context().Value(bound{})
	})
	srv := fixtureWith(t, binding{store}, h)
	post(t, srv.URL, "k", "x")
	assert.Equal(t, "k#1", <-got)
}
