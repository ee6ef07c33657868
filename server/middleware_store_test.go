package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestStoreStatusOption(t *testing.T) {
	var calls atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	})
	srv, _ := fixture(t, h, server.WithKeep(func(int) bool { return true }))
	post(t, srv.URL, "k", "x")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusBadGateway, got.status)
	assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(1), calls.Load())
}

func TestStoreFailure(t *testing.T) {
	t.Run("fail closed", func(t *testing.T) {
		h := &orders{}
		var got error
		srv := fixtureWith(t, failing{}, h, server.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			server.WriteProblem(w, r, err)
		}))
		resp := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusServiceUnavailable, resp.status)
		assertProblem(t, resp, "ErrStoreUnavailable")
		assert.Equal(t, "1", resp.header.Get("Retry-After"))
		assert.NotContains(t, resp.body, "store down", "the store's error is not shown to clients")
		assert.ErrorIs(t, got, engine.ErrStoreUnavailable)
		assert.ErrorIs(t, got, errDown)
		assert.Equal(t, int64(0), h.executions.Load(), "the handler must not run unprotected")
	})
	t.Run("fail open", func(t *testing.T) {
		h := &orders{}
		srv := fixtureWith(t, failing{}, h, server.WithConfig(engine.Config{FailOpen: true}))
		resp := post(t, srv.URL, "k", "body")
		assert.Equal(t, http.StatusCreated, resp.status)
		assert.Contains(t, resp.body, `"echo":"body"`, "the handler reads the body")
		assert.Equal(t, int64(1), h.executions.Load())
	})
}

// uncommitted is a transactional store whose Complete reports the
// handler's effects rolled back.
type uncommitted struct{ memstore.Store }

func (uncommitted) Bind(ctx context.Context, _ engine.ID, _ engine.Token) context.Context { return ctx }

func (s uncommitted) Complete(ctx context.Context, id engine.ID, tok engine.Token, _ *engine.Response, _ time.Duration) error {
	s.Store.Release(ctx, id, tok)
	return fmt.Errorf("uncommitted: %w", engine.ErrNotCommitted)
}

func TestNotCommittedAnswers503(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%v", failOpen), func(t *testing.T) {
			store, err := memstore.New()
			require.NoError(t, err)
			defer store.Close()
			h := &orders{}
			var opts []server.Option
			if failOpen {
				opts = append(opts, server.WithConfig(engine.Config{FailOpen: true}))
			}
			srv := fixtureWith(t, uncommitted{store}, h, opts...)
			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, http.StatusServiceUnavailable, got.status, "the handler's response must not reach the client")
			assertProblem(t, got, "ErrStoreUnavailable")
			assert.Empty(t, got.header.Get("Location"), "no header of the handler's")
			assert.Empty(t, got.header.Get("Set-Cookie"), "no header of the handler's")
			assert.Equal(t, int64(1), h.executions.Load(), "the handler runs once, even failing open")
		})
	}
}
