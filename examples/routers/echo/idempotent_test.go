package main

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// serveAdapter serves POST /r through outer, then idempotent, then the
// handler, on loopback.
func serveAdapter(t *testing.T, outer []echo.MiddlewareFunc, handler echo.HandlerFunc) *httptest.Server {
	t.Helper()
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	e := echo.New()
	e.Use(outer...)
	e.POST("/r", handler, idempotent(mw))
	srv := httptest.NewServer(e)
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

// What a handler writes, and the errors it returns, are stored and
// replayed; a 5xx is not stored, so its retry runs.
func TestAdapterStoresWhatHandlersAnswer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler echo.HandlerFunc
		status  int
		body    string
		runs    int64
	}{
		{"JSON", func(c echo.Context) error { return c.JSON(http.StatusCreated, echo.Map{"id": 1}) }, http.StatusCreated, `{"id":1}` + "\n", 1},
		{"NoContent", func(c echo.Context) error { return c.NoContent(http.StatusAccepted) }, http.StatusAccepted, "", 1},
		{"HTTPError", func(c echo.Context) error { return echo.NewHTTPError(http.StatusConflict, "out of stock") }, http.StatusConflict, `{"message":"out of stock"}` + "\n", 1},
		{"plain error", func(c echo.Context) error { return errors.New("database down") }, http.StatusInternalServerError, `{"message":"Internal Server Error"}` + "\n", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			srv := serveAdapter(t, nil, func(c echo.Context) error {
				runs.Add(1)
				return tc.handler(c)
			})
			first := send(t, srv, "k", "x")
			assert.Equal(t, tc.status, first.status)
			assert.Equal(t, tc.body, first.body)

			again := send(t, srv, "k", "x")
			assert.Equal(t, tc.status, again.status)
			assert.Equal(t, tc.body, again.body)
			if tc.runs == 1 {
				assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			}
			assert.Equal(t, tc.runs, runs.Load(), "handler runs")
		})
	}
}

// The handler gets the middleware's request: its body, and its context with
// the lease.
func TestAdapterHandsOverTheRequest(t *testing.T) {
	srv := serveAdapter(t, nil, func(c echo.Context) error {
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return err
		}
		lease, ok := engine.LeaseFromContext(c.Request().Context())
		if !ok {
			return errors.New("no lease")
		}
		return c.String(http.StatusCreated, lease.Key+" "+string(body))
	})
	got := send(t, srv, "k-1", "hello")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "k-1 hello", got.body)
}

// Middleware before the adapter sees, in c.Response(), the response that was
// sent, whoever wrote it.
func TestAdapterOuterMiddlewareSeesTheResponseSent(t *testing.T) {
	var runs atomic.Int64
	var seen atomic.Int64
	logger := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			seen.Store(int64(c.Response().Status))
			return err
		}
	}
	srv := serveAdapter(t, []echo.MiddlewareFunc{logger}, func(c echo.Context) error {
		runs.Add(1)
		return c.String(http.StatusCreated, "made")
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
		assert.Equal(t, int64(tc.status), seen.Load(), "%s: status seen by the outer middleware", tc.name)
	}
	assert.Equal(t, int64(1), runs.Load(), "handler runs")
}

// A panic is answered by middleware.Recover, on echo's response, and
// releases the key: the retry runs.
func TestAdapterPanicReleasesTheKey(t *testing.T) {
	var runs atomic.Int64
	recoverer := middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(_ echo.Context, err error, _ []byte) error { return err },
	})
	srv := serveAdapter(t, []echo.MiddlewareFunc{recoverer}, func(c echo.Context) error {
		if runs.Add(1) == 1 {
			panic("out of paper")
		}
		return c.String(http.StatusCreated, "made")
	})
	first := send(t, srv, "k", "x")
	assert.Equal(t, http.StatusInternalServerError, first.status)
	retry := send(t, srv, "k", "x")
	assert.Equal(t, http.StatusCreated, retry.status)
	assert.Equal(t, "made", retry.body)
	assert.Empty(t, retry.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(2), runs.Load(), "handler runs")
}
