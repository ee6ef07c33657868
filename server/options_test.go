package server_test

import (
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/configcases"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestNewValidates(t *testing.T) {
	store := newMem(t)
	for _, tc := range []struct {
		name string
		opts []server.Option
	}{
		{"ttl under the shortest lease", []server.Option{server.WithConfig(engine.Config{TTL: engine.MinLease - 1})}},
		{"lease", []server.Option{server.WithConfig(engine.Config{Lease: time.Millisecond})}},
		{"set-cookie", []server.Option{server.WithStoredHeaders("Content-Type", "set-cookie")}},
		{"authorization", []server.Option{server.WithStoredHeaders("Authorization")}},
		{"methods", []server.Option{server.WithMethods()}},
		{"empty method", []server.Option{server.WithMethods("POST", "")}},
		{"negative body", []server.Option{server.WithMaxBody(-1)}},
		{"lease over its default ttl", []server.Option{server.WithConfig(engine.Config{Lease: 25 * time.Hour})}},
		{"lease over a short ttl", []server.Option{server.WithConfig(engine.Config{TTL: time.Second, Lease: 2 * time.Second})}},
		{"nil option", []server.Option{nil}},
		{"nil keep", []server.Option{server.WithKeep(nil)}},
		{"nil key format", []server.Option{server.WithKeyFormat(nil)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := server.New(store, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, mw)
			assert.True(t, strings.HasPrefix(err.Error(), "server: "), "error %q has no package prefix", err)
		})
	}
}

func TestNewNamesEveryInvalidOption(t *testing.T) {
	_, err := server.New(newMem(t), server.WithMaxBody(-1), nil, server.WithConfig(engine.Config{RetryAfter: -1}))
	require.Error(t, err)
	for _, want := range []string{"body limit -1", "option 1 is nil", "Retry-After -1ns"} {
		assert.Contains(t, err.Error(), want)
	}
}

// TestConfigAsTheEngine: WithConfig is validated by engine.New, the same
// way in every door: a zero field is the engine's default, and an invalid
// configuration is refused with the engine's own message, after the
// package prefix.
func TestConfigAsTheEngine(t *testing.T) {
	store := newMem(t)
	for _, tc := range configcases.All() {
		t.Run(tc.Name, func(t *testing.T) {
			_, want := engine.New(store, tc.Config)
			mw, err := server.New(store, server.WithConfig(tc.Config))
			if want == nil {
				require.NoError(t, err)
				require.NotNil(t, mw)
				return
			}
			require.Error(t, err)
			assert.Nil(t, mw)
			assert.Equal(t, "server: "+want.Error(), err.Error())
		})
	}
}

// TestMethodsLowerCase: WithMethods("post") protects POSTs, as the client's
// WithMethods("post") keys them: a POST without a key is refused, a PATCH is
// not protected.
func TestMethodsLowerCase(t *testing.T) {
	srv, _ := fixture(t, &orders{}, server.WithMethods("post"))
	for method, want := range map[string]int{http.MethodPost: http.StatusBadRequest, http.MethodPatch: http.StatusCreated} {
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL, strings.NewReader("x"))
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "%s without a key", method)
	}
}

// TestNewRefusesNilStore: a nil Store, or a nil pointer in the interface,
// would panic on every request; New refuses it.
func TestNewRefusesNilStore(t *testing.T) {
	var typed memstore.Store
	for name, store := range map[string]engine.Store{"nil": nil, "typed nil": typed} {
		t.Run(name, func(t *testing.T) {
			mw, err := server.New(store)
			assert.Error(t, err)
			assert.Nil(t, mw)
		})
	}
}

// TestDefaultLeaseFollowsShortTTL: a TTL shorter than the default lease is
// enough on its own; the lease follows it.
func TestDefaultLeaseFollowsShortTTL(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{TTL: 2 * time.Second}))
	assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k", "x").status)
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
}

// TestOptionExtremes: every size and duration option, at 0, 1 and its
// largest value, is either refused by New or serves a request with a body
// (and its replay) without panicking.
func TestOptionExtremes(t *testing.T) {
	type outcome int
	const (
		refused     outcome = iota // New returns an error
		replayed                   // 201, then the same 201 replayed
		tooLarge                   // 413: the body is over the limit
		noBody                     // 201, replayed without its body
		unavailable                // 503: the store is not given time to answer
	)
	for _, tc := range []struct {
		name string
		opt  server.Option
		want outcome
	}{
		{"TTL 0: the default", server.WithConfig(engine.Config{TTL: 0}), replayed},
		{"TTL 1", server.WithConfig(engine.Config{TTL: 1}), refused},
		{"TTL max", server.WithConfig(engine.Config{TTL: math.MaxInt64}), replayed},
		{"lease 0: the default", server.WithConfig(engine.Config{Lease: 0}), replayed},
		{"lease 1", server.WithConfig(engine.Config{Lease: 1}), refused},
		{"lease max", server.WithConfig(engine.Config{Lease: math.MaxInt64}), refused}, // longer than the TTL
		{"WithMaxBody(0)", server.WithMaxBody(0), tooLarge},
		{"WithMaxBody(1)", server.WithMaxBody(1), tooLarge},
		{"WithMaxBody(max)", server.WithMaxBody(math.MaxInt64), replayed},
		{"WithMaxStored(0)", server.WithMaxStored(0), noBody},
		{"WithMaxStored(1)", server.WithMaxStored(1), noBody},
		{"WithMaxStored(max)", server.WithMaxStored(math.MaxInt), replayed},
		{"wait 0", server.WithConfig(engine.Config{Wait: 0}), replayed},
		{"wait 1", server.WithConfig(engine.Config{Wait: 1}), replayed},
		{"wait max", server.WithConfig(engine.Config{Wait: math.MaxInt64}), replayed},
		{"store timeout 0: the default", server.WithConfig(engine.Config{StoreTimeout: 0}), replayed},
		{"store timeout 1", server.WithConfig(engine.Config{StoreTimeout: 1}), unavailable},
		{"store timeout max", server.WithConfig(engine.Config{StoreTimeout: math.MaxInt64}), replayed},
		{"Retry-After 0: the default", server.WithConfig(engine.Config{RetryAfter: 0}), replayed},
		{"Retry-After 1", server.WithConfig(engine.Config{RetryAfter: 1}), replayed},
		{"Retry-After max", server.WithConfig(engine.Config{RetryAfter: math.MaxInt64}), replayed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMem(t)
			mw, err := server.New(store, tc.opt)
			if tc.want == refused {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			h := &orders{}
			srv := startServer(t, mw.Handler(h))
			first := post(t, srv.URL, "k", `{"sku":"A1"}`)
			switch tc.want {
			case tooLarge:
				assert.Equal(t, http.StatusRequestEntityTooLarge, first.status)
				assert.Equal(t, int64(0), h.executions.Load())
				return
			case unavailable:
				assert.Equal(t, http.StatusServiceUnavailable, first.status)
				assert.Equal(t, "1", first.header.Get("Retry-After"))
				assert.Equal(t, int64(0), h.executions.Load())
				return
			}
			require.Equal(t, http.StatusCreated, first.status, first.body)
			again := post(t, srv.URL, "k", `{"sku":"A1"}`)
			assert.Equal(t, http.StatusCreated, again.status)
			assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			if tc.want == noBody {
				assert.Equal(t, "true", again.header.Get("Idempotent-Body-Omitted"))
				assert.Empty(t, again.body)
			} else {
				assert.Equal(t, first.body, again.body)
			}
			assert.Equal(t, int64(1), h.executions.Load())
		})
	}
	t.Run("WithTTL(max) and WithLease(max)", func(t *testing.T) {
		h := &orders{}
		srv, _ := fixture(t, h, server.WithConfig(engine.Config{TTL: math.MaxInt64, Lease: math.MaxInt64}))
		assert.Equal(t, http.StatusCreated, post(t, srv.URL, "k", "x").status)
		assert.Equal(t, "true", post(t, srv.URL, "k", "x").header.Get("Idempotent-Replayed"))
		assert.Equal(t, int64(1), h.executions.Load())
	})
	t.Run("Retry-After at its largest", func(t *testing.T) {
		srv := fixtureWith(t, failing{}, &orders{}, server.WithConfig(engine.Config{RetryAfter: math.MaxInt64, Logger: discardLogger()}))
		got := post(t, srv.URL, "k", "x")
		assert.Equal(t, http.StatusServiceUnavailable, got.status)
		assert.Equal(t, "9223372037", got.header.Get("Retry-After"), "whole seconds, rounded up")
	})
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
