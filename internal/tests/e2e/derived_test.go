package e2e_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
)

// TestDerivedKeyThroughMiddleware: the key a handler sends downstream is
// the one DerivedKey's documentation computes from the incoming key as the
// middleware read it (the quoted form's text), and the scope its scope
// function returned: the inputs that a service in another language needs
// to reproduce it.
func TestDerivedKeyThroughMiddleware(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer downstream.Close()
	client, err := idempotency.NewClient(idempotency.WithHTTPClient(downstream.Client()))
	require.NoError(t, err)

	mw, err := server.New(teststores.Memory(t), server.WithScope(func(*http.Request) (string, error) { return "tenant-7", nil }))
	require.NoError(t, err)
	api := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := idempotency.ContextWithStep(r.Context(), "charge")
		resp, err := client.Post(ctx, downstream.URL, "application/json", strings.NewReader("{}"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.WriteHeader(http.StatusCreated)
	})))
	defer api.Close()

	for i, key := range []string{`"order-42"`, "order-42"} {
		req, err := http.NewRequest(http.MethodPost, api.URL, strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := api.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		if i == 0 {
			// The bare form is the same key: replayed, not run again.
			assert.Empty(t, resp.Header.Get(server.HeaderReplayed))
		} else {
			assert.Equal(t, "true", resp.Header.Get(server.HeaderReplayed))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"74222cf6-ee01-8d99-a7f9-b4f2ebb7aa29"}, seen)
}
