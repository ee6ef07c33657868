package server_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
)

func TestFirstRequestThenReplay(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	first := post(t, srv.URL+"/orders", "k1", `{"sku":"A"}`)
	require.Equal(t, http.StatusCreated, first.status)
	assert.Equal(t, "session=secret", first.header.Get("Set-Cookie"), "the first response is the handler's own")
	assert.Empty(t, first.header.Get("Idempotent-Replayed"))

	second := post(t, srv.URL+"/orders", "k1", `{"sku":"A"}`)
	assert.Equal(t, int64(1), h.executions.Load(), "executions")
	assert.Equal(t, first.status, second.status)
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "application/json", second.header.Get("Content-Type"))
	assert.Equal(t, "/orders/1", second.header.Get("Location"))
	assert.Empty(t, second.header.Get("Set-Cookie"), "Set-Cookie must never be replayed")
	assert.Empty(t, second.header.Get("X-Not-Listed"), "headers off the allow-list are not replayed")
	assert.Equal(t, strconv.Itoa(len(first.body)), second.header.Get("Content-Length"))
}

func TestQuotedKeyIsTheSameKey(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	first := post(t, srv.URL, "8e03978e-40d5-43e8-bc93-6894a57f9324", "x")
	second := post(t, srv.URL, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "x")
	assert.Equal(t, int64(1), h.executions.Load())
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
}

func TestKeyMismatch(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	post(t, srv.URL, "k", `{"amount":10}`)
	for _, tc := range []struct{ name, url, body string }{
		{"body", srv.URL, `{"amount":1000}`},
		{"path", srv.URL + "/other", `{"amount":10}`},
		{"query", srv.URL + "?x=1", `{"amount":10}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, tc.url, "k", tc.body)
			assert.Equal(t, http.StatusUnprocessableEntity, got.status)
			assertProblem(t, got, "ErrKeyMismatch")
		})
	}
	assert.Equal(t, int64(1), h.executions.Load())
}

func TestBadKeys(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	t.Run("missing", func(t *testing.T) {
		got := post(t, srv.URL, "", "x")
		assert.Equal(t, http.StatusBadRequest, got.status)
		assertProblem(t, got, "ErrMissingKey")
	})
	for _, tc := range []struct{ name, key string }{
		{"256 bytes", strings.Repeat("k", 256)},
		{"empty quoted", `""`},
		{"broken quoting", `"abc`},
		{"non-ASCII", "clé"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, srv.URL, tc.key, "x")
			assert.Equal(t, http.StatusBadRequest, got.status)
			assertProblem(t, got, "ErrInvalidKey")
		})
	}
	t.Run("255 bytes accepted", func(t *testing.T) {
		assert.Equal(t, http.StatusCreated, post(t, srv.URL, strings.Repeat("k", 255), "x").status)
	})
	// Go's client refuses to send control characters, so write the request
	// by hand.
	for _, tc := range []struct{ name, raw string }{
		{"control character", "Idempotency-Key: a\x01b\r\n"},
		{"empty", "Idempotency-Key: \r\n"},
		{"twice", "Idempotency-Key: a\r\nIdempotency-Key: b\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, http.StatusBadRequest, rawPost(t, srv.Listener.Addr().String(), tc.raw, "x"))
		})
	}
	assert.Equal(t, int64(1), h.executions.Load(), "only the 255-byte key ran")
}

func rawPost(t *testing.T, addr, headers, body string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s", len(body), headers, body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestBodyTooLarge(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithMaxBody(16))
	got := post(t, srv.URL, "k", strings.Repeat("x", 17))
	assert.Equal(t, http.StatusRequestEntityTooLarge, got.status)
	assertProblem(t, got, "ErrBodyTooLarge")

	// Without a Content-Length, the limit is found while reading.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader(strings.Repeat("x", 17))))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "k2")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

	assert.Equal(t, int64(0), h.executions.Load(), "the handler must not run")
	assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k3", strings.Repeat("x", 16)).status)
}

func TestMethodsAndOptionalKey(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithKeyOptional())
	for range 2 {
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
	}
	post(t, srv.URL, "", "no key")
	post(t, srv.URL, "", "no key")
	assert.Equal(t, int64(4), h.executions.Load(), "GET and keyless POSTs pass through")

	h2 := &orders{}
	srv2, _ := fixture(t, h2, server.WithMethods("PUT"))
	post(t, srv2.URL, "", "POST is no longer protected")
	assert.Equal(t, int64(1), h2.executions.Load())
}

func TestCrossTenant(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	alice := post(t, srv.URL, "shared", "x", "Authorization", "Bearer alice")
	bob := post(t, srv.URL, "shared", "x", "Authorization", "Bearer bob")
	assert.Equal(t, int64(2), h.executions.Load(), "each tenant's request runs")
	assert.NotEqual(t, alice.body, bob.body)
	assert.Empty(t, bob.header.Get("Idempotent-Replayed"))
	again := post(t, srv.URL, "shared", "x", "Authorization", "Bearer alice")
	assert.Equal(t, alice.body, again.body, "alice gets her own replay")
}

func TestScopeFromApplication(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithScope(func(r *http.Request) (string, error) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "" {
			return "", errors.New("no tenant")
		}
		return "tenant:" + tenant, nil
	}))
	post(t, srv.URL, "k", "x", "X-Tenant", "a")
	post(t, srv.URL, "k", "x", "X-Tenant", "b")
	assert.Equal(t, int64(2), h.executions.Load())
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusBadRequest, got.status)
	assertProblem(t, got, "ErrUnidentified")
}
