// Package exampletest checks the example programs' orders APIs, which all
// behave alike whatever router they use: callers authenticate with an
// X-API-Key header (alice-key-1 and alice-key-2 for one account, bob-key for
// another), POST /orders creates an order answered 201 with its JSON and a
// Location, and the idempotency middleware protects that route with the
// account as its scope.
package exampletest

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/idemtest"
)

// API is one example's orders API, made afresh for a test.
type API struct {
	// Handler serves the API, as the program does.
	Handler http.Handler
	// Orders returns how many orders an account has.
	Orders func(account string) int
}

// Run checks the API that newAPI makes, over real loopback connections.
func Run(t *testing.T, newAPI func(t *testing.T) API) {
	t.Helper()
	start := func(t *testing.T) (*httptest.Server, API) {
		api := newAPI(t)
		srv := httptest.NewServer(api.Handler)
		t.Cleanup(srv.Close)
		return srv, api
	}
	t.Run("SameKeyRunsOnceAndReplays", func(t *testing.T) {
		srv, api := start(t)
		first := post(t, srv, "alice-key-1", "order-1", book1)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		assert.Empty(t, first.header.Get("Idempotent-Replayed"))

		again := post(t, srv, "alice-key-1", "order-1", book1)
		assert.Equal(t, http.StatusCreated, again.status)
		assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, first.header.Get("Location"), again.header.Get("Location"))

		// The account's other API key is the same caller.
		rotated := post(t, srv, "alice-key-2", "order-1", book1)
		assert.Equal(t, "true", rotated.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, rotated.body)
		assert.Equal(t, 1, api.Orders("acct_alice"), "orders created")

		// The order is there, at its Location.
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+first.header.Get("Location"), nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", "alice-key-1")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	})
	t.Run("SameKeyOtherAccountRunsSeparately", func(t *testing.T) {
		srv, api := start(t)
		alice := post(t, srv, "alice-key-1", "order-1", book1)
		require.Equal(t, http.StatusCreated, alice.status, alice.body)
		bob := post(t, srv, "bob-key", "order-1", book1)
		require.Equal(t, http.StatusCreated, bob.status, bob.body)
		assert.Empty(t, bob.header.Get("Idempotent-Replayed"), "Bob was served a replay")
		assert.NotEqual(t, orderID(t, alice), orderID(t, bob))
		assert.Contains(t, bob.body, `"account":"acct_bob"`)
		assert.Equal(t, 1, api.Orders("acct_alice"))
		assert.Equal(t, 1, api.Orders("acct_bob"))
	})
	for _, tc := range []struct {
		name        string
		apiKey, key string
		body        string
		status      int
		contentType string
	}{
		{"MissingKey", "alice-key-1", "", book1, http.StatusBadRequest, "application/problem+json"},
		{"KeyReusedForAnotherOrder", "alice-key-1", "order-1", `{"item":"pen","quantity":2}`, http.StatusUnprocessableEntity, "application/problem+json"},
		{"UnknownAPIKey", "mallory-key", "order-2", book1, http.StatusUnauthorized, "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, api := start(t)
			first := post(t, srv, "alice-key-1", "order-1", book1)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			got := post(t, srv, tc.apiKey, tc.key, tc.body)
			assert.Equal(t, tc.status, got.status, got.body)
			mediaType, _, _ := mime.ParseMediaType(got.header.Get("Content-Type"))
			assert.Equal(t, tc.contentType, mediaType)
			assert.Equal(t, 1, api.Orders("acct_alice"), "orders created")
		})
	}
	// The protocol checks of idemtest, Bob being the second caller.
	t.Run("Contract", func(t *testing.T) {
		srv, _ := start(t)
		report, err := idemtest.Check(t.Context(), idemtest.Target{
			URL:              srv.URL,
			Path:             "/orders",
			Header:           http.Header{"X-API-Key": {"alice-key-1"}, "Content-Type": {"application/json"}},
			Body:             idemtest.BodyTemplate(`{"item":"book {{variant}}","quantity":1}`),
			SecondCredential: http.Header{"X-API-Key": {"bob-key"}},
		})
		require.NoError(t, err)
		assert.NoError(t, report.Err())
		t.Log(report.Summary())
	})
}

const book1 = `{"item":"book","quantity":1}`

type reply struct {
	status int
	header http.Header
	body   string
}

// post sends POST /orders with the API key and, if not empty, the
// idempotency key.
func post(t *testing.T, srv *httptest.Server, apiKey, idemKey, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-Key", apiKey)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func orderID(t *testing.T, r reply) string {
	t.Helper()
	var o struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(r.body), &o), "body %q", r.body)
	return o.ID
}
