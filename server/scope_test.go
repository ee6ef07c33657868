package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestCredentialHeadersScope: two callers that authenticate with the same
// credential header, with different values, and send the same key are not
// served each other's response; the same caller again is.
func TestCredentialHeadersScope(t *testing.T) {
	for _, name := range []string{"Authorization", "Proxy-Authorization", "X-API-Key", "api-key", "X-Auth-Token", "X-Goog-Api-Key", "Private-Token"} {
		t.Run(name, func(t *testing.T) {
			h := &orders{}
			srv, _ := fixture(t, h)
			alice := post(t, srv.URL, "order-123", `{"sku":"A1"}`, name, "alice-secret")
			bob := post(t, srv.URL, "order-123", `{"sku":"A1"}`, name, "bob-secret")
			require.Equal(t, http.StatusCreated, alice.status)
			require.Equal(t, http.StatusCreated, bob.status)
			assert.Empty(t, bob.header.Get("Idempotent-Replayed"), "bob was replayed alice's response")
			assert.NotEqual(t, alice.body, bob.body)
			again := post(t, srv.URL, "order-123", `{"sku":"A1"}`, name, "alice-secret")
			assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			assert.Equal(t, alice.body, again.body)
			assert.Equal(t, int64(2), h.executions.Load())
		})
	}
}

func TestCredentialScope(t *testing.T) {
	scope := func(header ...string) string {
		r, err := http.NewRequest(http.MethodPost, "/", nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		s, err := server.CredentialScope(r)
		require.NoError(t, err)
		return s
	}
	assert.Empty(t, scope(), "no credentials: the shared scope")
	assert.Empty(t, scope("Cookie", "session=1"), "cookies are not credentials here")
	assert.Empty(t, scope("X-Api-Key", ""), "an empty header is none")
	assert.Equal(t, scope("X-Api-Key", "k"), scope("X-Api-Key", "k", "Cookie", "a=b"), "cookies do not change it")
	assert.Equal(t, scope("x-api-key", "k"), scope("X-API-KEY", "k"), "header names are canonical")
	assert.NotEqual(t, scope("X-Api-Key", "k"), scope("Api-Key", "k"), "the header is part of it")
	assert.NotEqual(t, scope("X-Api-Key", "k"), scope("X-Api-Key", "k", "Authorization", "Bearer t"))
	assert.NotEqual(t, scope("X-Api-Key", "ab"), scope("X-Api-Key", "a", "X-Api-Key", "b"), "values are length-prefixed")
	s := scope("Authorization", "Bearer secret-token")
	assert.NotContains(t, s, "secret-token", "the credential is never in the scope")
	assert.True(t, strings.HasPrefix(s, "cred:"), "scope %q", s)
	assert.Contains(t, server.CredentialHeaders, "X-Api-Key")
	assert.NotContains(t, server.CredentialHeaders, "Cookie")
}

// TestNoCredentialsWarnedOnce: a keyed request without credentials, when
// no WithScope is set, is logged once at warn level; with WithScope, or
// with a credential, it is not.
func TestNoCredentialsWarnedOnce(t *testing.T) {
	const warning = "idempotent request without credentials"
	logger := func(b *syncBuffer) server.Option {
		return server.WithConfig(engine.Config{Logger: slog.New(slog.NewTextHandler(b, nil))})
	}
	t.Run("default scope", func(t *testing.T) {
		var logs syncBuffer
		srv, _ := fixture(t, &orders{}, logger(&logs))
		post(t, srv.URL, "k1", "x")
		post(t, srv.URL, "k2", "x")
		assert.Equal(t, 1, strings.Count(logs.String(), warning), logs.String())
		assert.Contains(t, logs.String(), "level=WARN")
	})
	t.Run("with credentials", func(t *testing.T) {
		var logs syncBuffer
		srv, _ := fixture(t, &orders{}, logger(&logs))
		post(t, srv.URL, "k1", "x", "X-Api-Key", "k")
		assert.NotContains(t, logs.String(), warning)
	})
	t.Run("WithScope", func(t *testing.T) {
		var logs syncBuffer
		srv, _ := fixture(t, &orders{}, logger(&logs), server.WithScope(func(*http.Request) (string, error) { return "", nil }))
		post(t, srv.URL, "k1", "x")
		assert.NotContains(t, logs.String(), warning)
	})
}

// TestBearerScope: under the default scope, a retry whose bearer token was
// refreshed falls in another scope and runs again (the property WithScope's
// doc warns of), and the first request scoped by a bearer token is logged
// once at warn level; with the scope set from the authenticated principal,
// the retry is a replay, and nothing is logged.
func TestBearerScope(t *testing.T) {
	const warning = "scoped by a bearer token"
	logger := func(b *syncBuffer) server.Option {
		return server.WithConfig(engine.Config{Logger: slog.New(slog.NewTextHandler(b, nil))})
	}
	t.Run("default scope", func(t *testing.T) {
		var logs syncBuffer
		h := &orders{}
		srv, _ := fixture(t, h, logger(&logs))
		first := post(t, srv.URL, "order-1", "x", "Authorization", "Bearer token-before-refresh")
		retry := post(t, srv.URL, "order-1", "x", "Authorization", "Bearer token-after-refresh")
		post(t, srv.URL, "order-2", "x", "Authorization", "Bearer token-after-refresh")
		require.Equal(t, http.StatusCreated, first.status)
		require.Equal(t, http.StatusCreated, retry.status)
		assert.Empty(t, retry.header.Get("Idempotent-Replayed"))
		assert.Equal(t, int64(3), h.executions.Load(), "the refreshed token is another scope: the retry ran again")
		assert.Equal(t, 1, strings.Count(logs.String(), warning), logs.String())
		assert.Contains(t, logs.String(), "level=WARN")
		assert.NotContains(t, logs.String(), "token-", "the credential is never logged")
	})
	t.Run("API key", func(t *testing.T) {
		var logs syncBuffer
		srv, _ := fixture(t, &orders{}, logger(&logs))
		post(t, srv.URL, "order-1", "x", "Authorization", "Basic YWxpY2U6c2VjcmV0")
		post(t, srv.URL, "order-2", "x", "X-Api-Key", "k")
		assert.NotContains(t, logs.String(), warning)
	})
	t.Run("principal", func(t *testing.T) {
		var logs syncBuffer
		h := &orders{}
		store, err := memstore.New()
		require.NoError(t, err)
		t.Cleanup(func() { store.Close() })
		mw, err := server.New(store, logger(&logs), server.WithScope(func(r *http.Request) (string, error) {
			account, ok := r.Context().Value(accountKey{}).(string)
			if !ok {
				return "", errors.New("no account")
			}
			return "account:" + account, nil
		}))
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, mw.Shutdown(context.Background())) })
		// The application's authentication: both tokens are alice's.
		tokens := map[string]string{"Bearer token-before-refresh": "alice", "Bearer token-after-refresh": "alice"}
		authenticate := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				account, ok := tokens[r.Header.Get("Authorization")]
				if !ok {
					http.Error(w, "unauthenticated", http.StatusUnauthorized)
					return
				}
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
			})
		}
		srv := startServer(t, authenticate(mw.Handler(h)))
		first := post(t, srv.URL, "order-1", "x", "Authorization", "Bearer token-before-refresh")
		retry := post(t, srv.URL, "order-1", "x", "Authorization", "Bearer token-after-refresh")
		require.Equal(t, http.StatusCreated, first.status)
		assert.Equal(t, "true", retry.header.Get("Idempotent-Replayed"))
		assert.Equal(t, first.body, retry.body)
		assert.Equal(t, int64(1), h.executions.Load())
		assert.NotContains(t, logs.String(), warning)
	})
}

type accountKey struct{}

// BenchmarkCredentialScope: the default scope of a request with a bearer
// token, and of one without credentials.
func BenchmarkCredentialScope(b *testing.B) {
	for _, tc := range []struct{ name, header, value string }{
		{"bearer", "Authorization", "Bearer " + strings.Repeat("t", 40)},
		{"jwt", "Authorization", "Bearer " + strings.Repeat("t", 900)},
		{"none", "", ""},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, err := http.NewRequest(http.MethodPost, "/", nil)
			require.NoError(b, err)
			if tc.header != "" {
				r.Header.Set(tc.header, tc.value)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := server.CredentialScope(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
