package idempotency_test

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/keyfield"
)

func TestConcurrentKeys(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)

	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			resp, err := c.Post(t.Context(), srv.URL, "application/json", strings.NewReader("{}"))
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	distinct := make(map[string]bool)
	for _, k := range s.keysSeen() {
		require.NotEmpty(t, k)
		distinct[k] = true
	}
	assert.Len(t, distinct, n, "distinct keys")
}

func TestKeyPrecedence(t *testing.T) {
	tests := []struct {
		name      string
		header    string
		ctxKey    string
		wantKey   string
		wantWire  string
		generated bool
	}{
		{name: "generated", generated: true},
		{name: "context", ctxKey: "order-42", wantKey: "order-42", wantWire: "order-42"},
		{name: "header wins over context", header: "caller-1", ctxKey: "order-42", wantKey: "caller-1", wantWire: "caller-1"},
		{name: "quoted header kept as is", header: `"caller-2"`, wantKey: "caller-2", wantWire: `"caller-2"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))
			srv := newServer(t, s)
			c := newClient(t, srv)
			ctx := t.Context()
			if tt.ctxKey != "" {
				ctx = idempotency.ContextWithKey(ctx, tt.ctxKey)
			}
			req := post(t, ctx, srv.URL, "x")
			if tt.header != "" {
				req.Header.Set(hdrKey, tt.header)
			}

			resp, err := c.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			o := outcome(t, resp)
			keys := s.keysSeen()
			require.Len(t, keys, 2)
			assert.Equal(t, keys[0], keys[1])
			if tt.generated {
				assert.NoError(t, uuid.Validate(o.Key))
				assert.Equal(t, o.Key, keys[0])
				return
			}
			assert.Equal(t, tt.wantKey, o.Key)
			assert.Equal(t, tt.wantWire, keys[0])
		})
	}
}

func TestKeyFromContext(t *testing.T) {
	_, ok := idempotency.KeyFromContext(t.Context())
	assert.False(t, ok)
	k, ok := idempotency.KeyFromContext(idempotency.ContextWithKey(t.Context(), "abc"))
	assert.True(t, ok)
	assert.Equal(t, "abc", k)
}

func TestNewKey(t *testing.T) {
	a, b := idempotency.NewKey(), idempotency.NewKey()
	assert.NotEqual(t, a, b)
	u, err := uuid.Parse(a)
	require.NoError(t, err)
	assert.Equal(t, uuid.Version(4), u.Version())
}

// TestContextKeyFirstSent: ContextWithKey carries the time of the first
// try; KeyFromContext still gives the key alone.
func TestContextKeyFirstSent(t *testing.T) {
	first := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ctx := idempotency.ContextWithKey(t.Context(), "abc", first)
	k, ok := idempotency.KeyFromContext(ctx)
	assert.True(t, ok)
	assert.Equal(t, "abc", k)
}

func TestQuotedKey(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	// The IETF draft's form: a Structured Field string.
	c := newClient(t, srv, idempotency.WithDialect(func(*http.Request) idempotency.Dialect {
		return idempotency.Dialect{Key: func(k string) (string, error) { return strconv.Quote(k), nil }}
	}))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	wire := s.keysSeen()[0]
	assert.True(t, strings.HasPrefix(wire, `"`) && strings.HasSuffix(wire, `"`), "header = %s, want a quoted string", wire)
	key, err := keyfield.Parse(wire)
	require.NoError(t, err)
	assert.Equal(t, outcome(t, resp).Key, key)
}

func TestCustomHeaderNames(t *testing.T) {
	got := make(chan string, 1)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Request-Key")
		w.Header().Set("X-Replayed", "true")
		w.WriteHeader(http.StatusOK)
	}))
	c := newClient(t, srv, idempotency.WithDialect(func(*http.Request) idempotency.Dialect {
		return idempotency.Dialect{
			Header: "x-request-key",
			Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
				if resp.Header.Get("X-Replayed") == "true" {
					return idempotency.EventReplayed, 0, nil
				}
				return 0, 0, nil
			},
		}
	}))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o := outcome(t, resp)
	assert.Equal(t, o.Key, <-got)
	assert.True(t, o.Replayed)
	assert.True(t, o.Honoured)
}

func TestKeyedMethods(t *testing.T) {
	tests := []struct {
		method string
		keyed  bool
	}{
		{http.MethodPost, true},
		{http.MethodPatch, true},
		{http.MethodGet, false},
		{http.MethodHead, false},
		{http.MethodPut, false},
		{http.MethodDelete, false},
		{http.MethodOptions, false},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			s := newScript(status(http.StatusServiceUnavailable), status(http.StatusOK))
			srv := newServer(t, s)
			c := newClient(t, srv)
			req, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL, nil)
			require.NoError(t, err)

			resp, err := c.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			o := outcome(t, resp)
			// Every method here is retried: with a key, or idempotent.
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, 2, o.Attempts)
			keys := s.keysSeen()
			if tt.keyed {
				assert.NotEmpty(t, o.Key)
				assert.Equal(t, []string{o.Key, o.Key}, keys)
			} else {
				assert.Empty(t, o.Key)
				assert.Equal(t, []string{"", ""}, keys)
			}
		})
	}
}

func TestUnkeyedPostNotRetried(t *testing.T) {
	t.Run("status", func(t *testing.T) {
		s := newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))
		srv := newServer(t, s)
		c := newClient(t, srv, idempotency.WithMethods(http.MethodPatch))

		resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		o := outcome(t, resp)
		assert.Equal(t, 1, o.Attempts)
		assert.Empty(t, o.Key)
		assert.ErrorIs(t, o.Stopped, idempotency.ErrNotIdempotent)
		assert.Equal(t, []string{""}, s.keysSeen())
	})
	t.Run("lost response", func(t *testing.T) {
		s := newScript(lost, status(http.StatusCreated))
		srv := newServer(t, s)
		c := newClient(t, srv, idempotency.WithMethods(http.MethodPatch))

		_, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.Error(t, err)
		assert.ErrorIs(t, err, idempotency.ErrNotIdempotent)
		var re *idempotency.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, 1, re.Attempts)
		assert.EqualValues(t, 1, s.hits.Load(), "server hits")
	})
}

func TestContextKeyOnlyForKeyedMethods(t *testing.T) {
	s := newScript(status(http.StatusOK))
	srv := newServer(t, s)
	c := newClient(t, srv)
	req, err := http.NewRequestWithContext(idempotency.ContextWithKey(t.Context(), "order-42"), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)

	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Empty(t, outcome(t, resp).Key)
	assert.Equal(t, []string{""}, s.keysSeen())
}

// headerSpy is a Transport that records, for each request it sends, the
// names under which the request's header holds the key, in any letter case,
// and their values.
type headerSpy struct {
	http.RoundTripper
	name string

	mu   sync.Mutex
	seen []http.Header
}

func (s *headerSpy) RoundTrip(req *http.Request) (*http.Response, error) {
	got := http.Header{}
	for k, vs := range req.Header {
		if strings.EqualFold(k, s.name) {
			got[k] = append([]string(nil), vs...)
		}
	}
	s.mu.Lock()
	s.seen = append(s.seen, got)
	s.mu.Unlock()
	return s.RoundTripper.RoundTrip(req)
}

func (s *headerSpy) all() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]http.Header(nil), s.seen...)
}

func TestCallerKeyInAnyCase(t *testing.T) {
	tests := []struct {
		name    string
		option  idempotency.Option
		method  string
		header  http.Header
		wantKey string // "" when Do refuses the request
	}{
		{"canonical", nil, http.MethodPost, http.Header{"Idempotency-Key": {"k-1"}}, "k-1"},
		{"lower case", nil, http.MethodPost, http.Header{"idempotency-key": {"k-2"}}, "k-2"},
		{"upper case", nil, http.MethodPost, http.Header{"IDEMPOTENCY-KEY": {"k-3"}}, "k-3"},
		{"lower case, quoted", nil, http.MethodPost, http.Header{"idempotency-key": {`"k-4"`}}, "k-4"},
		{"lower case on an unkeyed method", nil, http.MethodPut, http.Header{"idempotency-key": {"k-5"}}, "k-5"},
		{"custom header name", idempotency.WithDialect(func(*http.Request) idempotency.Dialect { return idempotency.Dialect{Header: "X-Request-Key"} }), http.MethodPost, http.Header{"x-request-key": {"k-6"}}, "k-6"},
		{"two values", nil, http.MethodPost, http.Header{"Idempotency-Key": {"k-7", "k-8"}}, ""},
		{"two names", nil, http.MethodPost, http.Header{"Idempotency-Key": {"k-9"}, "idempotency-key": {"k-10"}}, ""},
		{"two names, one key", nil, http.MethodPost, http.Header{"Idempotency-Key": {"k-11"}, "idempotency-key": {"k-11"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			headerName := hdrKey
			var opts []idempotency.Option
			if tt.option != nil {
				headerName = "X-Request-Key"
				opts = append(opts, tt.option)
			}
			var mu sync.Mutex
			var wire [][]string
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				wire = append(wire, r.Header.Values(headerName))
				if len(wire) == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			spy := &headerSpy{RoundTripper: srv.Client().Transport, name: headerName}
			opts = append(opts, idempotency.WithHTTPClient(&http.Client{Transport: spy}))
			c := newClient(t, srv, opts...)
			req, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL, strings.NewReader("x"))
			require.NoError(t, err)
			for k, vs := range tt.header {
				req.Header[k] = append([]string(nil), vs...)
			}

			resp, err := c.Do(req)
			assert.Equal(t, tt.header, req.Header, "the caller's header after Do")
			if tt.wantKey == "" {
				require.ErrorIs(t, err, idempotency.ErrInvalidKey)
				assert.Contains(t, err.Error(), "2 values")
				assert.Empty(t, spy.all(), "requests sent")
				return
			}
			require.NoError(t, err)
			resp.Body.Close()
			o := outcome(t, resp)
			assert.Equal(t, tt.wantKey, o.Key)
			assert.Equal(t, 2, o.Attempts)
			wireValue := tt.header[slices.Collect(maps.Keys(tt.header))[0]][0]
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, [][]string{{wireValue}, {wireValue}}, wire, "keys the server got")
			for i, h := range spy.all() {
				assert.Equal(t, http.Header{headerName: {wireValue}}, h, "key header of attempt %d", i+1)
			}
		})
	}
}
