package idempotency_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/wire"
)

// problem answers with a problem document of the given members, and the
// given header pairs.
func problem(code int, members string, header ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{%s,"status":%d}`, members, code)
	}
}

// TestServerAnswers: what is retried, and what the Outcome says, for the
// answers of a server that honours keys and the hints of other servers.
func TestServerAnswers(t *testing.T) {
	typ := func(s string) string { return `"type":"` + s + `"` }
	retry409 := func(resp *http.Response, err error) bool {
		return resp != nil && resp.StatusCode == http.StatusConflict || idempotency.DefaultPolicy(resp, err)
	}
	tests := []struct {
		name     string
		first    http.HandlerFunc
		opts     []idempotency.Option
		attempts int
		stopped  error
		kind     idempotency.EventKind
	}{
		{"in flight: this module's type", problem(409, typ(wire.TypeInFlight)), nil, 2, nil, idempotency.EventCompleted},
		{"in flight: this module's code", problem(409, `"type":"about:blank","code":"`+wire.CodeInFlight+`"`), nil, 2, nil, idempotency.EventCompleted},
		{"in flight: the draft's title", problem(409, `"type":"https://developer.example.com/idempotency","title":"`+
			"A request is outstanding for this Idempotency-Key"+`"`), nil, 2, nil, idempotency.EventCompleted},
		{"in flight: Retry-After", status(409, "Retry-After", "0"), nil, 2, nil, idempotency.EventCompleted},
		{"business conflict", problem(409, typ("https://api.example/email-taken")), nil, 1, nil, idempotency.EventCompleted},
		{"business conflict, widened policy", problem(409, typ("https://api.example/email-taken")),
			[]idempotency.Option{idempotency.WithRetryPolicy(retry409)}, 2, nil, idempotency.EventCompleted},
		{"outcome unknown: type", problem(409, typ(wire.TypeOutcomeUnknown)), nil, 1, idempotency.ErrOutcomeUnknown, idempotency.EventCompleted},
		{"outcome unknown: code", problem(409, `"type":"about:blank","code":"`+wire.CodeOutcomeUnknown+`"`), nil, 1, idempotency.ErrOutcomeUnknown, idempotency.EventCompleted},
		{"outcome unknown, whatever the policy and the hint", problem(409, typ(wire.TypeOutcomeUnknown), "Stripe-Should-Retry", "true"),
			[]idempotency.Option{idempotency.WithRetryPolicy(retry409)}, 1, idempotency.ErrOutcomeUnknown, idempotency.EventCompleted},
		{"key mismatch", problem(422, typ(wire.TypeKeyMismatch)), nil, 1, idempotency.ErrKeyMismatch, idempotency.EventCompleted},
		{"key mismatch: code", problem(422, `"code":"`+wire.CodeKeyMismatch+`"`), nil, 1, idempotency.ErrKeyMismatch, idempotency.EventCompleted},
		{"plain 422", status(422), nil, 1, nil, idempotency.EventCompleted},
		{"Stripe-Should-Retry: false", status(503, "Stripe-Should-Retry", "false"), nil, 1, idempotency.ErrRetryRefused, idempotency.EventGaveUp},
		{"X-Should-Retry: false", status(500, "X-Should-Retry", "false"), nil, 1, idempotency.ErrRetryRefused, idempotency.EventGaveUp},
		{"false wins over true", status(503, "X-Should-Retry", "true", "Stripe-Should-Retry", "false"), nil, 1, idempotency.ErrRetryRefused, idempotency.EventGaveUp},
		{"false on a final status", status(400, "X-Should-Retry", "false"), nil, 1, nil, idempotency.EventCompleted},
		{"Stripe-Should-Retry: true", status(400, "Stripe-Should-Retry", "true"), nil, 2, nil, idempotency.EventCompleted},
		{"X-Should-Retry: true", status(409, "X-Should-Retry", "true"), nil, 2, nil, idempotency.EventCompleted},
		{"true on a success", status(201, "X-Should-Retry", "true"), nil, 1, nil, idempotency.EventCompleted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var first bytes.Buffer
			s := newScript(func(w http.ResponseWriter, r *http.Request) {
				rec := &teeWriter{ResponseWriter: w, copy: &first}
				tt.first(rec, r)
			}, status(http.StatusCreated))
			srv := newServer(t, s)
			c := newClient(t, srv, tt.opts...)

			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			body := readAll(t, resp)
			o := outcome(t, resp)
			assert.Equal(t, tt.attempts, o.Attempts, "Attempts")
			assert.EqualValues(t, tt.attempts, s.hits.Load(), "server hits")
			if tt.stopped != nil {
				assert.ErrorIs(t, o.Stopped, tt.stopped)
			} else {
				assert.NoError(t, o.Stopped)
			}
			assert.Equal(t, tt.kind, o.Kind, "Kind")
			if tt.attempts == 1 {
				// The caller gets the whole body, problem documents included.
				assert.Equal(t, first.String(), body)
			}
		})
	}
}

// teeWriter keeps a copy of the body it writes.
type teeWriter struct {
	http.ResponseWriter
	copy *bytes.Buffer
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.copy.Write(p)
	return w.ResponseWriter.Write(p)
}

// TestPolicyInFlight: DefaultPolicy on 409s that did not come through a
// Client.
func TestPolicyInFlight(t *testing.T) {
	assert.True(t, idempotency.DefaultPolicy(&http.Response{StatusCode: 409, Header: http.Header{"Retry-After": {"1"}}}, nil))
	assert.False(t, idempotency.DefaultPolicy(&http.Response{StatusCode: 409, Header: http.Header{}}, nil))
}

// TestHonour: what Outcome.Honoured says of the key, and the warning about a
// server that may not honour keys.
func TestHonour(t *testing.T) {
	echo := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(hdrKey, r.Header.Get(hdrKey))
			w.WriteHeader(code)
		}
	}
	quotedEcho := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(hdrKey, `"`+r.Header.Get(hdrKey)+`"`)
		w.WriteHeader(http.StatusCreated)
	}
	tests := []struct {
		name  string
		steps []http.HandlerFunc
		get   bool
		want  bool // Honoured
		warn  bool
	}{
		{"echoed", []http.HandlerFunc{echo(201)}, false, true, false},
		{"echoed as a string", []http.HandlerFunc{quotedEcho}, false, true, false},
		{"echoed after a retry", []http.HandlerFunc{lost, echo(201)}, false, true, false},
		{"replayed", []http.HandlerFunc{lost, status(201, hdrReplayed, "true")}, false, true, false},
		{"first attempt, no echo", []http.HandlerFunc{status(201)}, false, false, false},
		{"retried, no echo", []http.HandlerFunc{lost, status(201)}, false, false, true},
		{"another key echoed", []http.HandlerFunc{lost, status(201, hdrKey, "other")}, false, false, true},
		{"no key", []http.HandlerFunc{lost, status(200)}, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, newScript(tt.steps...))
			var logged bytes.Buffer
			c := newClient(t, srv, idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))))
			req := post(t, t.Context(), srv.URL, "x")
			if tt.get {
				var err error
				req, err = http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
				require.NoError(t, err)
			}
			resp, err := c.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tt.want, outcome(t, resp).Honoured, "Honoured")
			warned := strings.Count(logged.String(), "may not honour")
			if tt.warn {
				assert.Equal(t, 1, warned, "warnings:\n%s", logged.String())
			} else {
				assert.Zero(t, warned, "warnings:\n%s", logged.String())
			}
		})
	}

	t.Run("warned once per Client", func(t *testing.T) {
		s := newScript(lost, status(201))
		srv := newServer(t, s)
		var logged bytes.Buffer
		c := newClient(t, srv, idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
		for range 3 {
			s.hits.Store(0)
			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			resp.Body.Close()
			assert.False(t, outcome(t, resp).Honoured, "Honoured")
		}
		assert.Equal(t, 1, strings.Count(logged.String(), "may not honour"), "warnings:\n%s", logged.String())
	})
}

// TestPolicyPanics: a Policy that panics says "do not retry"; the panic is
// logged once and the response returned.
func TestPolicyPanics(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable))
	srv := newServer(t, s)
	var logged bytes.Buffer
	c := newClient(t, srv,
		idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))),
		idempotency.WithRetryPolicy(func(*http.Response, error) bool { panic("policy bug") }),
	)
	for range 3 {
		resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, 1, outcome(t, resp).Attempts)
	}
	assert.Equal(t, 1, strings.Count(logged.String(), "recovered a panic"), "log:\n%s", logged.String())
	assert.Contains(t, logged.String(), "policy bug")
}

// TestRetryObserverPanics: an observer that panics on a retry does not stop
// the retry.
func TestRetryObserverPanics(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))
	srv := newServer(t, s)
	var logged bytes.Buffer
	c := newClient(t, srv,
		idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))),
		onRetry(func() { panic("hook bug") }),
	)
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, 2, outcome(t, resp).Attempts)
	assert.Contains(t, logged.String(), "hook bug")
}

// TestDialectKeyPanics: a dialect's key function that panics fails the call
// before any attempt, and closes the request body.
func TestDialectKeyPanics(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := newServer(t, s)
	var logged bytes.Buffer
	c := newClient(t, srv,
		idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))),
		idempotency.WithDialect(func(*http.Request) idempotency.Dialect {
			return idempotency.Dialect{Key: func(string) (string, error) { panic("key bug") }}
		}),
	)
	body := &closeTracker{Reader: strings.NewReader("x")}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	_, err = c.Do(req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "key bug")
	assert.True(t, body.closed.Load(), "request body closed")
	assert.Zero(t, s.hits.Load(), "server hits")
	assert.Contains(t, logged.String(), "recovered a panic")
}

// TestOtherAPIsReplayMarkers: a Dialect with a key header of its own and no
// Answer reads the replay markers of the APIs that use other headers
// (Integrated Finance, PPRO, fiskaly); the zero Dialect reads only its own.
func TestOtherAPIsReplayMarkers(t *testing.T) {
	for _, m := range [][2]string{
		{"X-Idempotency-Status", "replayed"},
		{"Request-Idempotency", "true"},
		{"X-Idempotency-Replayed", `"true"`},
		{"Idempotent-Replayed", "true"},
	} {
		srv := newServer(t, newScript(status(201, m[0], m[1])))
		other := newClient(t, srv, idempotency.WithDialect(func(*http.Request) idempotency.Dialect {
			return idempotency.Dialect{Header: "X-Idempotency-Key"}
		}))
		resp, err := other.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.True(t, outcome(t, resp).Replayed, "%s: %s, another API's dialect", m[0], m[1])

		resp, err = newClient(t, srv).Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, m[0] == "Idempotent-Replayed", outcome(t, resp).Replayed, "%s: %s, the zero Dialect", m[0], m[1])
	}
}
