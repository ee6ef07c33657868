package vendors_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/vendors"
)

// TestKeyLimits: each API's key of the longest length it takes is sent as
// it is; one character more is refused before any attempt.
func TestKeyLimits(t *testing.T) {
	var hits atomic.Int64
	var last atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		last.Store(r.Header.Clone())
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name    string
		dialect func() idempotency.Dialect
		header  string
		longest string
	}{
		{"Stripe", vendors.Stripe, "Idempotency-Key", strings.Repeat("k", 255)},
		{"Adyen", vendors.Adyen, "Idempotency-Key", strings.Repeat("k", 64)},
		{"PayPal", vendors.PayPal, "PayPal-Request-Id", strings.Repeat("k", 108)},
		{"Checkout.com", vendors.CheckoutCom, "Cko-Idempotency-Key", strings.Repeat("k", 255)},
		{"Worldline", vendors.Worldline, "X-GCS-Idempotence-Key", strings.Repeat("k", 40)},
		{"Telnyx", vendors.Telnyx, "Idempotency-Key", strings.Repeat("A_:-9", 51)},
		{"Resend", vendors.Resend, "Idempotency-Key", strings.Repeat("k", 255)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clienttest.New(t, idempotency.WithHTTPClient(srv.Client()),
				idempotency.WithDialect(func(*http.Request) idempotency.Dialect { return tc.dialect() }))
			for _, key := range []string{tc.longest, tc.longest + "k"} {
				before := hits.Load()
				resp, err := c.Post(idempotency.ContextWithKey(t.Context(), key), srv.URL, "application/json", strings.NewReader("{}"))
				if len(key) == len(tc.longest) {
					require.NoError(t, err, "%d characters", len(key))
					resp.Body.Close()
					assert.Equal(t, key, last.Load().(http.Header).Get(tc.header))
					continue
				}
				assert.ErrorIs(t, err, idempotency.ErrInvalidKey, "%d characters", len(key))
				assert.Equal(t, before, hits.Load(), "%d characters: sent", len(key))
			}
		})
	}
	t.Run("Azure", func(t *testing.T) {
		c := clienttest.New(t, idempotency.WithHTTPClient(srv.Client()),
			idempotency.WithDialect(func(*http.Request) idempotency.Dialect { return vendors.Azure() }))
		guid := "F47AC10B-58CC-4372-A567-0E02B2C3D479"
		for _, key := range []string{guid, guid[:35], guid + "0", "{" + guid + "}", "urn:uuid:" + guid, strings.ReplaceAll(guid, "-", "")} {
			before := hits.Load()
			resp, err := c.Post(idempotency.ContextWithKey(t.Context(), key), srv.URL, "application/json", strings.NewReader("{}"))
			if key == guid {
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, key, last.Load().(http.Header).Get("Repeatability-Request-ID"))
				continue
			}
			assert.ErrorIs(t, err, idempotency.ErrInvalidKey, key)
			assert.Equal(t, before, hits.Load(), "%s: sent", key)
		}
	})
}
