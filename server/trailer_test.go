package server_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeclaredTrailers: trailers the handler declares go out as trailers,
// whatever the body's size; a replay carries none, but a trailer whose name
// is on the stored-headers list is stored and replayed as a header.
func TestDeclaredTrailers(t *testing.T) {
	for _, size := range []int{10, 2048, 100_000} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			body := strings.Repeat("b", size)
			h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Trailer", "X-Checksum, Content-Digest")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, body)
				w.Header().Set("X-Checksum", "sum")
				w.Header().Set("Content-Digest", "sha-256=:x:")
			})
			srv, _ := fixture(t, h)
			for i := range 2 {
				req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "k")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, body, string(b))
				if i == 0 {
					assert.Equal(t, "sum", resp.Trailer.Get("X-Checksum"), "sent as a trailer")
					assert.Equal(t, "sha-256=:x:", resp.Trailer.Get("Content-Digest"), "sent as a trailer")
					assert.Empty(t, resp.Header.Get("X-Checksum"), "not sent as a header")
					assert.Empty(t, resp.Header.Get("Content-Digest"), "not sent as a header")
					continue
				}
				assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
				assert.Empty(t, resp.Trailer, "a replay has no trailers")
				assert.Empty(t, resp.Header.Get("X-Checksum"), "not on the stored-headers list")
				assert.Equal(t, "sha-256=:x:", resp.Header.Get("Content-Digest"), "on the list: replayed as a header")
			}
		})
	}
}
