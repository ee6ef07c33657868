package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// losingBinder is a transactional store (a Binder) that loses every lease
// at its first renewal.
type losingBinder struct{ losing }

func (losingBinder) Bind(ctx context.Context, _ engine.ID, _ engine.Token) context.Context {
	return ctx
}

// TestLeaseLostNoAnswerBinderHeaders: a handler that set headers and then
// gave up without an answer when its lease was lost, on a Binder's store:
// its work is undone with the release, so the 503 carries none of its
// headers, as the 503 of a Complete that could not commit does. (Before the
// engine, only the latter dropped them.)
func TestLeaseLostNoAnswerBinderHeaders(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Set-Cookie", "session=handler")
		w.Header().Set("Location", "/orders/1")
		<-r.Context().Done()
	})
	srv := fixtureWith(t, losingBinder{losing{store}}, h, server.WithConfig(engine.Config{Lease: 600 * time.Millisecond}))
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusServiceUnavailable, got.status)
	assertProblem(t, got, "ErrStoreUnavailable")
	assert.Empty(t, got.header.Get("Set-Cookie"), "no header of the handler's")
	assert.Empty(t, got.header.Get("Location"), "no header of the handler's")
}
