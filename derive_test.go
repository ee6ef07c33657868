package idempotency_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/incoming"
	"github.com/idemkit/idempotency/internal/keyfield"
)

// handling returns ctx as the middleware makes it for a request with key
// in scope.
func handling(ctx context.Context, scope, key string) context.Context {
	return incoming.NewContext(ctx, &incoming.Key{Scope: scope, Key: key})
}

// TestDerivedKeys: inside a handler, the key of each downstream call is
// derived from the incoming key, the scope and the step, the same in every
// run of the handler, and distinct for distinct steps, keys and scopes.
func TestDerivedKeys(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)
	send := func(ctx context.Context, path string) string {
		t.Helper()
		resp, err := c.Do(post(t, ctx, srv.URL+path, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		return outcome(t, resp).Key
	}
	run := handling(t.Context(), "tenant-a", "order-17")
	rerun := handling(context.Background(), "tenant-a", "order-17") // the takeover's retry, elsewhere

	charge := send(idempotency.ContextWithStep(run, "charge"), "/charges")
	assert.Equal(t, charge, send(idempotency.ContextWithStep(rerun, "charge"), "/charges"), "the same step in another run")
	assert.Equal(t, charge, send(idempotency.ContextWithStep(run, "charge"), "/charges/v2"), "a step names the operation, whatever the URL")
	others := map[string]string{
		"another step":  send(idempotency.ContextWithStep(run, "refund"), "/charges"),
		"another key":   send(idempotency.ContextWithStep(handling(t.Context(), "tenant-a", "order-18"), "charge"), "/charges"),
		"another scope": send(idempotency.ContextWithStep(handling(t.Context(), "tenant-b", "order-17"), "charge"), "/charges"),
		"no step":       send(run, "/charges"),
	}
	seen := map[string]string{charge: "charge"}
	for name, key := range others {
		if prev, dup := seen[key]; dup {
			t.Errorf("%s: key %q, the same as %s", name, key, prev)
		}
		seen[key] = name
	}

	// Without a step, the method and URL name the operation.
	assert.Equal(t, others["no step"], send(rerun, "/charges"), "no step, same URL, another run")
	query := send(run, "/charges?currency=eur")
	assert.NotContains(t, seen, query, "no step, another query")
	seen[query] = "query"

	// What another SDK is given is what the Client sends.
	k, ok := idempotency.DerivedKey(run, "charge")
	require.True(t, ok)
	assert.Equal(t, charge, k, "DerivedKey()")
	_, ok = idempotency.DerivedKey(t.Context(), "charge")
	assert.False(t, ok, "DerivedKey() ok without an incoming key")

	// Every key went on the wire as it is reported.
	for _, key := range s.keysSeen() {
		assert.Contains(t, seen, key)
	}
}

// TestDerivedKeyPrecedence: a key the caller sets wins over a derived one.
func TestDerivedKeyPrecedence(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)
	ctx := idempotency.ContextWithStep(handling(t.Context(), "", "in"), "step")
	derived, _ := idempotency.DerivedKey(ctx, "step")

	req := post(t, ctx, srv.URL, "x")
	req.Header.Set(idempotency.HeaderKey, "from-header")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "from-header", outcome(t, resp).Key)

	resp, err = c.Do(post(t, idempotency.ContextWithKey(ctx, "from-context"), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "from-context", outcome(t, resp).Key)

	// A method that gets no key gets no derived key either.
	req, err = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Empty(t, outcome(t, resp).Key)

	assert.Equal(t, []string{"from-header", "from-context", ""}, s.keysSeen())
	assert.NotContains(t, s.keysSeen(), derived)
}

// TestDerivedKeySyntax: a derived key is a valid key, and shows nothing of
// what it is derived from, whatever that is.
func TestDerivedKeySyntax(t *testing.T) {
	long := strings.Repeat("k", 255)
	tests := []struct{ scope, key, step string }{
		{"", "k", ""},
		{"tenant", "order-1", "charge"},
		{strings.Repeat("s", 4096), long, strings.Repeat("\x00\xff", 100)},
		{"tenant", "order-1", "POST https://api.example/charges?x=1"},
	}
	for _, tt := range tests {
		k, ok := idempotency.DerivedKey(handling(t.Context(), tt.scope, tt.key), tt.step)
		require.True(t, ok)
		assert.NoError(t, keyfield.Validate(k), "key %q", k)
		assert.LessOrEqual(t, len(k), 255)
		for _, r := range k {
			assert.True(t, r > ' ' && r < 0x7f, "key %q has %q", k, r)
		}
		if len(tt.key) > 3 {
			assert.NotContains(t, k, tt.key)
		}
		if len(tt.scope) > 3 {
			assert.NotContains(t, k, tt.scope)
		}
		again, _ := idempotency.DerivedKey(handling(t.Context(), tt.scope, tt.key), tt.step)
		assert.Equal(t, k, again, "deterministic")
	}
	// The scope's length is part of what is hashed: moving bytes from the
	// scope to the step gives another key.
	a, _ := idempotency.DerivedKey(handling(t.Context(), "ab", "k"), "c")
	b, _ := idempotency.DerivedKey(handling(t.Context(), "a", "k"), "bc")
	assert.NotEqual(t, a, b)
}
