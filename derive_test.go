package idempotency_test

import (
	"context"
	"errors"
	"fmt"
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
	k, ok := (&idempotency.Client{}).DerivedKey(run, "charge")
	require.True(t, ok)
	assert.Equal(t, charge, k, "DerivedKey()")
	_, ok = (&idempotency.Client{}).DerivedKey(t.Context(), "charge")
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
	derived, _ := (&idempotency.Client{}).DerivedKey(ctx, "step")

	req := post(t, ctx, srv.URL, "x")
	req.Header.Set(hdrKey, "from-header")
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
		k, ok := (&idempotency.Client{}).DerivedKey(handling(t.Context(), tt.scope, tt.key), tt.step)
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
		again, _ := (&idempotency.Client{}).DerivedKey(handling(t.Context(), tt.scope, tt.key), tt.step)
		assert.Equal(t, k, again, "deterministic")
	}
	// The scope's length is part of what is hashed: moving bytes from the
	// scope to the step gives another key.
	a, _ := (&idempotency.Client{}).DerivedKey(handling(t.Context(), "ab", "k"), "c")
	b, _ := (&idempotency.Client{}).DerivedKey(handling(t.Context(), "a", "k"), "bc")
	assert.NotEqual(t, a, b)
}

// secret is a derivation secret of the tests: 32 bytes.
var secret = []byte("0123456789abcdef0123456789abcdef")

// guess tries the incoming keys order-48000 to order-48499 against key, as
// a downstream service that knows the scope and the step can: it returns
// the one that gives key, if any.
func guess(t *testing.T, key, scope, step string) (string, bool) {
	t.Helper()
	for n := 48000; n < 48500; n++ {
		candidate := fmt.Sprintf("order-%d", n)
		if k, _ := (&idempotency.Client{}).DerivedKey(handling(t.Context(), scope, candidate), step); k == key {
			return candidate, true
		}
	}
	return "", false
}

// TestDerivedKeySecret: without a secret, a guessable incoming key is
// found from a derived key by whoever knows the scope and the step (a
// downstream service knows its URL, which names a request without a
// step); with WithDerivedKeySecret it is not, and the key is still the same
// in every Client with the secret.
func TestDerivedKeySecret(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	run := handling(t.Context(), "tenant-a", "order-48213")
	step := "POST " + srv.URL + "/charges"
	send := func(c *idempotency.Client, ctx context.Context) string {
		t.Helper()
		resp, err := c.Do(post(t, ctx, srv.URL+"/charges", "x"))
		require.NoError(t, err)
		resp.Body.Close()
		return outcome(t, resp).Key
	}

	plain := send(newClient(t, srv), run)
	found, ok := guess(t, plain, "tenant-a", step)
	require.True(t, ok, "the guessable key is found without a secret")
	assert.Equal(t, "order-48213", found)

	c := newClient(t, srv, idempotency.WithDerivedKeySecret(secret))
	key := send(c, run)
	assert.NotEqual(t, plain, key)
	_, ok = guess(t, key, "tenant-a", step)
	assert.False(t, ok, "an incoming key found through a derived key made with a secret")
	// Another Client with the secret, in another run of the handler,
	// sends the same key; one with another secret does not.
	again := newClient(t, srv, idempotency.WithDerivedKeySecret(append([]byte(nil), secret...)))
	assert.Equal(t, key, send(again, handling(context.Background(), "tenant-a", "order-48213")))
	other := newClient(t, srv, idempotency.WithDerivedKeySecret([]byte("another secret of 32 bytes......")))
	assert.NotEqual(t, key, send(other, run))
	// What another SDK is given is what the Client sends.
	k, ok := c.DerivedKey(idempotency.ContextWithStep(run, "charge"), "charge")
	require.True(t, ok)
	assert.Equal(t, k, send(c, idempotency.ContextWithStep(run, "charge")))
	_, ok = c.DerivedKey(t.Context(), "charge")
	assert.False(t, ok)

	// The secret is copied: changing the caller's slice changes nothing.
	mine := append([]byte(nil), secret...)
	copied := newClient(t, srv, idempotency.WithDerivedKeySecret(mine))
	mine[0] ^= 0xff
	assert.Equal(t, key, send(copied, run))

	_, err := idempotency.NewClient(idempotency.WithDerivedKeySecret([]byte("short")), idempotency.WithDerivedKeySecret(nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithDerivedKeySecret needs at least 16 bytes, got 5")
	assert.Contains(t, err.Error(), "WithDerivedKeySecret needs at least 16 bytes, got 0")
}

// TestDerivedKeyForm: a derived key is sent in the form that the
// request's Dialect gives it, the same in every run of the handler; the
// Outcome's key is the derived key itself.
func TestDerivedKeyForm(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	run := idempotency.ContextWithStep(handling(t.Context(), "tenant-a", "order-17"), "charge")
	rerun := idempotency.ContextWithStep(handling(context.Background(), "tenant-a", "order-17"), "charge")
	c := newClient(t, srv, idempotency.WithDialect(func(*http.Request) idempotency.Dialect {
		return idempotency.Dialect{Key: func(k string) (string, error) { return "ord_" + strings.ReplaceAll(k, "-", ""), nil }}
	}))
	send := func(ctx context.Context) (sent, key string) {
		t.Helper()
		resp, err := c.Do(post(t, ctx, srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		seen := s.keysSeen()
		return seen[len(seen)-1], outcome(t, resp).Key
	}
	sent, key := send(run)
	assert.Regexp(t, `^ord_[0-9a-f]{32}$`, sent)
	derived, ok := c.DerivedKey(run, "charge")
	require.True(t, ok)
	assert.Equal(t, derived, key, "Outcome.Key")
	again, _ := send(rerun)
	assert.Equal(t, sent, again, "another run")
	outside, _ := send(t.Context())
	assert.Regexp(t, `^ord_[0-9a-f]{12}4`, outside, "outside a handler: a version 4 UUID in the dialect's form")
}

// TestDerivedKeyGolden pins the derivation as DerivedKey documents it, so
// that no release changes the keys a retried handler sends. The expected
// keys were computed from the documented steps alone, with another
// language's HMAC-SHA256 (Python's hmac and hashlib), and are checked both
// as DerivedKey returns them and as the Client sends them.
func TestDerivedKeyGolden(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	for _, tc := range []struct {
		scope, key, step string
		secret           bool
		sum, v8, v7      string
	}{
		{"tenant-7", "order-42", "charge", false,
			"74222cf6ee01dd99e7f9b4f2ebb7aa29b2bbaed2191c8c206dcfaf346766c8af",
			"74222cf6-ee01-8d99-a7f9-b4f2ebb7aa29", "74222cf6-ee01-7d99-a7f9-b4f2ebb7aa29"},
		{"", "k", "", false,
			"1971b66e3e9cf939c5b313ce2d63286671e384d2462d17edbcc14ac420109b77",
			"1971b66e-3e9c-8939-85b3-13ce2d632866", "1971b66e-3e9c-7939-85b3-13ce2d632866"},
		// A scope of 200 bytes: its length is a varint of two bytes.
		{strings.Repeat("s", 200), "order-48213", "refund", false,
			"9c273966679aeb9250e3bc5d88adaea62ed63388587d786bb1f43438539e2bbb",
			"9c273966-679a-8b92-90e3-bc5d88adaea6", "9c273966-679a-7b92-90e3-bc5d88adaea6"},
		{"tënant", "order-42", "étape", false,
			"830734536a5db6e9be02fc23a38bb7cf9cd0b2fdf0012f16f089bc8bb671f1d2",
			"83073453-6a5d-86e9-be02-fc23a38bb7cf", "83073453-6a5d-76e9-be02-fc23a38bb7cf"},
		{"tenant-7", "order-42", "charge", true,
			"5421e510746ff8794c6c2f38ae744a6d9a6df4ecd6149f988f1ac38c93748de0",
			"5421e510-746f-8879-8c6c-2f38ae744a6d", "5421e510-746f-7879-8c6c-2f38ae744a6d"},
	} {
		name := fmt.Sprintf("%.12s/%s/%s/secret=%v", tc.scope, tc.key, tc.step, tc.secret)
		ctx := handling(t.Context(), tc.scope, tc.key)
		var opts []idempotency.Option
		if tc.secret {
			opts = append(opts, idempotency.WithDerivedKeySecret(secret))
		} else {
			k, ok := (&idempotency.Client{}).DerivedKey(ctx, tc.step)
			require.True(t, ok)
			assert.Equal(t, tc.v8, k, "%s: DerivedKey", name)
		}
		c := newClient(t, srv, opts...)
		k, _ := c.DerivedKey(ctx, tc.step)
		assert.Equal(t, tc.v8, k, "%s: Client.DerivedKey", name)
		resp, err := c.Do(post(t, idempotency.ContextWithStep(ctx, tc.step), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tc.v8, outcome(t, resp).Key, "%s: sent", name)
	}

	// Without a step, the step is the method, a space and the URL.
	ctx := handling(t.Context(), "tenant-7", "order-42")
	k, _ := (&idempotency.Client{}).DerivedKey(ctx, "POST https://api.example.com/charges?currency=eur")
	assert.Equal(t, "268b1417-0231-87dc-b17a-0b66bd4a3e04", k)
	// The request is caught before the network, with its key.
	sent := make(chan string, 1)
	c, err := idempotency.NewClient(idempotency.WithMaxAttempts(1), idempotency.WithHTTPClient(&http.Client{
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent <- r.Header.Get(hdrKey)
			return nil, errors.New("caught")
		}),
	}))
	require.NoError(t, err)
	req := post(t, ctx, "https://user:password@api.example.com/charges?currency=eur#fragment", "x")
	_, err = c.Do(req)
	require.Error(t, err)
	assert.Equal(t, "268b1417-0231-87dc-b17a-0b66bd4a3e04", <-sent, "the key of a request without a step")
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
