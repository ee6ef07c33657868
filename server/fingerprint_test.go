package server_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestFingerprintInPlace: the middleware computes the default fingerprint in
// place, and reads small bodies into its own buffer; what it stores is what
// server.Fingerprint gives, so that a middleware with a fingerprint function
// of its own that calls it replays the record, and refuses another body.
// Bodies around the size read in place, of known and unknown length, reach
// the handler whole.
func TestFingerprintInPlace(t *testing.T) {
	tests := []struct {
		name    string
		size    int
		chunked bool // the length is not declared
	}{
		{"empty", 0, false},
		{"small", 10, false},
		{"in place", 2047, false},
		{"at the buffer", 2048, false},
		{"past the buffer", 5000, false},
		{"chunked small", 100, true},
		{"chunked past the buffer", 70000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, err := memstore.New()
			require.NoError(t, err)
			t.Cleanup(func() { store.Close() })
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusCreated)
				w.Write(b)
			})
			inPlace, err := server.New(store)
			require.NoError(t, err)
			own, err := server.New(store, server.WithFingerprint(func(r *http.Request, body []byte) (string, error) {
				return server.Fingerprint(r, body)
			}))
			require.NoError(t, err)
			body := bytes.Repeat([]byte("abcdefghij"), tt.size/10+1)[:tt.size]
			do := func(h http.Handler, body []byte) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/orders?x=1", bytes.NewReader(body))
				if tt.chunked {
					req.ContentLength = -1
				}
				req.Header.Set("Idempotency-Key", "k-"+strconv.Itoa(tt.size))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}

			first := do(inPlace.Handler(handler), body)
			require.Equal(t, http.StatusCreated, first.Code)
			assert.Equal(t, string(body), first.Body.String(), "the handler's body")
			again := do(own.Handler(handler), body)
			assert.Equal(t, http.StatusCreated, again.Code)
			assert.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
			assert.Equal(t, string(body), again.Body.String())
			other := do(own.Handler(handler), append(bytes.Clone(body), 'z'))
			assert.Equal(t, http.StatusUnprocessableEntity, other.Code)
		})
	}
}
