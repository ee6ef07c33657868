package server_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// replayedByDefault is the documented default allow-list, spelled as a user
// would.
var replayedByDefault = []string{
	"Allow", "Cache-Control", "Content-Digest", "Content-Disposition", "Content-Encoding",
	"Content-Language", "Content-Location", "Content-Range", "Content-Type", "Digest",
	"ETag", "Expires", "Last-Modified", "Link", "Location", "Repr-Digest", "Retry-After",
	"Vary", "WWW-Authenticate",
}

// TestDefaultHeadersReplayed: every header on the default list, set by the
// handler the usual way, comes back on the replay, values in order.
func TestDefaultHeadersReplayed(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, name := range replayedByDefault {
			w.Header().Add(name, "v1-"+name)
			w.Header().Add(name, "v2-"+name)
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv, _ := fixture(t, h)
	first := post(t, srv.URL, "k", "x")
	second := post(t, srv.URL, "k", "x")
	require.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	for _, name := range replayedByDefault {
		assert.Equal(t, first.header.Values(name), second.header.Values(name), name)
		assert.Equal(t, []string{"v1-" + name, "v2-" + name}, second.header.Values(name), name)
	}
}

// TestNonCanonicalHeaderReplayed: a handler that writes the header map with
// a name net/http would not use still has it replayed.
func TestNonCanonicalHeaderReplayed(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["ETag"] = []string{`"v1"`}
		w.WriteHeader(http.StatusCreated)
	})
	srv, _ := fixture(t, h, server.WithStoredHeaders("etag", "content-type"))
	post(t, srv.URL, "k", "x")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, `"v1"`, got.header.Get("Etag"))
}

// TestEncodedBodyReplayed: a gzip body is replayed with its Content-Encoding,
// byte for byte.
func TestEncodedBodyReplayed(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	io.WriteString(zw, strings.Repeat(`{"order":1}`, 100))
	zw.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Language", "fr")
		w.WriteHeader(http.StatusCreated)
		w.Write(zipped.Bytes())
	})
	srv, _ := fixture(t, h)
	raw := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer raw.CloseIdleConnections()
	get := func() (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := raw.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, b
	}
	_, firstBody := get()
	resp, body := get()
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, "gzip", resp.Header.Get("Content-Encoding"))
	assert.Equal(t, "fr", resp.Header.Get("Content-Language"))
	assert.Equal(t, firstBody, body)
	assert.Equal(t, zipped.Bytes(), body)
	// And a client that decodes gets the same JSON both times.
	decoded := post(t, srv.URL, "k", "x")
	assert.Equal(t, strings.Repeat(`{"order":1}`, 100), decoded.body)
}

// TestReplayIsACopy: a middleware in front that edits the replay's header
// values in place, once they are sent, changes nothing in later replays.
func TestReplayIsACopy(t *testing.T) {
	vandal := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r)
			for _, vs := range w.Header() {
				for i := range vs {
					vs[i] = "vandalised"
				}
			}
		})
	}
	h := &orders{}
	mw, err := server.New(newMem(t))
	require.NoError(t, err)
	srv := startServer(t, vandal(mw.Handler(h)))
	first := post(t, srv.URL, "k", "x")
	for range 3 {
		got := post(t, srv.URL, "k", "x")
		assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"), "the marker")
		assert.Equal(t, first.header.Get("Content-Type"), got.header.Get("Content-Type"))
		assert.Equal(t, first.header.Get("Location"), got.header.Get("Location"))
	}
}

func newMem(t *testing.T) memstore.Store {
	t.Helper()
	s, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestKeyEchoed: every answer to a request with a valid key carries the key
// back, as sent; WithEchoKey(false) turns that off.
func TestKeyEchoed(t *testing.T) {
	h := newBlocking()
	srv, _ := fixture(t, h)
	first := postAsync(srv.URL, `"quoted"`, "x")
	<-h.started
	inFlight := post(t, srv.URL, `"quoted"`, "x")
	assert.Equal(t, http.StatusConflict, inFlight.status)
	assert.Equal(t, `"quoted"`, inFlight.header.Get("Idempotency-Key"), "on a 409")
	mismatch := post(t, srv.URL, "quoted", "other")
	assert.Equal(t, http.StatusUnprocessableEntity, mismatch.status)
	assert.Equal(t, "quoted", mismatch.header.Get("Idempotency-Key"), "on a 422, as sent")
	close(h.release)
	assert.Equal(t, `"quoted"`, (<-first).header.Get("Idempotency-Key"), "on the original")
	replay := post(t, srv.URL, "quoted", "x")
	assert.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	assert.Equal(t, []string{"quoted"}, replay.header.Values("Idempotency-Key"), "on a replay, once")

	off, _ := fixture(t, &orders{}, server.WithEchoKey(false))
	assert.Empty(t, post(t, off.URL, "k", "x").header.Values("Idempotency-Key"))
	assert.Empty(t, post(t, off.URL, "k", "x").header.Values("Idempotency-Key"))
}
