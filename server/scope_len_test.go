package server_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestScopeTooLong: a scope function that returns more than
// engine.MaxScopeLen bytes gets the request refused with 400 before any
// claim, and the handler does not run; the longest accepted scope works.
func TestScopeTooLong(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	for _, n := range []int{engine.MaxScopeLen, engine.MaxScopeLen + 1} {
		mw, err := server.New(store, server.WithScope(func(*http.Request) (string, error) {
			return strings.Repeat("s", n), nil
		}))
		require.NoError(t, err)
		ran := 0
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			ran++
			w.WriteHeader(http.StatusCreated)
		}))
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "scope-len")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if n <= engine.MaxScopeLen {
			assert.Equal(t, http.StatusCreated, rec.Code)
			assert.Equal(t, 1, ran)
			continue
		}
		assert.Equal(t, http.StatusBadRequest, rec.Code)
		assert.Contains(t, rec.Body.String(), "unidentified")
		assert.Zero(t, ran)
	}
}
