package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// serveAdapter serves POST /r through idempotent, between outer and the
// handler, on loopback.
func serveAdapter(t *testing.T, outer []gin.HandlerFunc, handler gin.HandlerFunc) *httptest.Server {
	t.Helper()
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	r := gin.New()
	r.Use(outer...)
	r.POST("/r", idempotent(mw), handler)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv
}

// send posts body to /r with the idempotency key, if any.
type reply struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, srv *httptest.Server, key, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/r", strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// The middleware stores what gin's ways of answering write, and replays it.
func TestAdapterStoresWhatHandlersWrite(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler gin.HandlerFunc
		status  int
		body    string
	}{
		{"JSON", func(c *gin.Context) { c.JSON(http.StatusCreated, gin.H{"id": 1}) }, http.StatusCreated, `{"id":1}`},
		{"status only", func(c *gin.Context) { c.Status(http.StatusAccepted) }, http.StatusAccepted, ""},
		{"nothing", func(c *gin.Context) {}, http.StatusOK, ""},
		{"last status before the body", func(c *gin.Context) {
			c.Status(http.StatusOK)
			c.String(http.StatusCreated, "made")
		}, http.StatusCreated, "made"},
		{"String after Header", func(c *gin.Context) {
			c.Header("Location", "/r/1")
			c.String(http.StatusCreated, "made %d", 1)
		}, http.StatusCreated, "made 1"},
		{"4xx", func(c *gin.Context) { c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": "no"}) }, http.StatusBadRequest, `{"error":"no"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			srv := serveAdapter(t, nil, func(c *gin.Context) {
				runs.Add(1)
				tc.handler(c)
			})
			first := send(t, srv, "k", "x")
			assert.Equal(t, tc.status, first.status)
			assert.Equal(t, tc.body, first.body)

			again := send(t, srv, "k", "x")
			assert.Equal(t, tc.status, again.status)
			assert.Equal(t, tc.body, again.body)
			assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			assert.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
			assert.Equal(t, int64(1), runs.Load(), "handler runs")
		})
	}
}

// The handler gets the middleware's request: its body, and its context with
// the lease.
func TestAdapterHandsOverTheRequest(t *testing.T) {
	srv := serveAdapter(t, nil, func(c *gin.Context) {
		body, err := io.ReadAll(c.Request.Body)
		if err != nil {
			c.Status(http.StatusInternalServerError)
			return
		}
		lease, ok := engine.LeaseFromContext(c.Request.Context())
		if !ok {
			c.String(http.StatusInternalServerError, "no lease")
			return
		}
		c.String(http.StatusCreated, "%s %s", lease.Key, body)
	})
	got := send(t, srv, "k-1", "hello")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "k-1 hello", got.body)
}

// With ContextWithFallback, *gin.Context itself reaches the lease too.
func TestAdapterLeaseThroughGinContext(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	r := gin.New()
	r.ContextWithFallback = true
	r.POST("/r", idempotent(mw), func(c *gin.Context) {
		lease, ok := engine.LeaseFromContext(c)
		c.String(http.StatusCreated, "%s %v", lease.Key, ok)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)

	got := send(t, srv, "k-1", "x")
	assert.Equal(t, "k-1 true", got.body)
}

// A refusal aborts the chain; handlers before the adapter see, in c.Writer,
// the response that was sent, whoever wrote it.
func TestAdapterOuterHandlersSeeTheResponseSent(t *testing.T) {
	var runs atomic.Int64
	var seen atomic.Int64
	logger := func(c *gin.Context) {
		c.Next()
		seen.Store(int64(c.Writer.Status()))
	}
	srv := serveAdapter(t, []gin.HandlerFunc{logger}, func(c *gin.Context) {
		runs.Add(1)
		c.String(http.StatusCreated, "made")
	})
	for _, tc := range []struct {
		name, key, body string
		status          int
	}{
		{"first", "k", "x", http.StatusCreated},
		{"replay", "k", "x", http.StatusCreated},
		{"missing key", "", "x", http.StatusBadRequest},
		{"key reused", "k", "y", http.StatusUnprocessableEntity},
	} {
		got := send(t, srv, tc.key, tc.body)
		assert.Equal(t, tc.status, got.status, tc.name)
		assert.Equal(t, int64(tc.status), seen.Load(), "%s: status seen by the outer handler", tc.name)
	}
	assert.Equal(t, int64(1), runs.Load(), "handler runs")
}

// A panic is answered by gin.Recovery, on gin's writer, and releases the
// key: the retry runs.
func TestAdapterPanicReleasesTheKey(t *testing.T) {
	var runs atomic.Int64
	srv := serveAdapter(t, []gin.HandlerFunc{gin.RecoveryWithWriter(io.Discard)}, func(c *gin.Context) {
		if runs.Add(1) == 1 {
			panic("out of paper")
		}
		c.String(http.StatusCreated, "made")
	})
	first := send(t, srv, "k", "x")
	assert.Equal(t, http.StatusInternalServerError, first.status)
	retry := send(t, srv, "k", "x")
	assert.Equal(t, http.StatusCreated, retry.status)
	assert.Equal(t, "made", retry.body)
	assert.Empty(t, retry.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(2), runs.Load(), "handler runs")
}
