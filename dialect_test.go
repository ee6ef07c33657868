package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
)

// headerLog records the header of every request it serves, and answers
// each with the next of its handlers (the last one for all after them).
type headerLog struct {
	steps []http.HandlerFunc

	mu   sync.Mutex
	seen []http.Header
}

func (h *headerLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h.mu.Lock()
	h.seen = append(h.seen, r.Header.Clone())
	step := h.steps[min(len(h.seen), len(h.steps))-1]
	h.mu.Unlock()
	step(w, r)
}

func (h *headerLog) headers() []http.Header {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]http.Header(nil), h.seen...)
}

// values returns, for each request served, the values of name.
func (h *headerLog) values(name string) [][]string {
	var out [][]string
	for _, hd := range h.headers() {
		out = append(out, hd.Values(name))
	}
	return out
}

func dialectOf(d idempotency.Dialect) idempotency.Option {
	return idempotency.WithDialect(func(*http.Request) idempotency.Dialect { return d })
}

// TestDialectKeyForms: a Key function's form of a key that could not be
// sent as it is (empty, with a line break or other control character,
// non-ASCII, too long) or an error refuses the request before any attempt.
func TestDialectKeyForms(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  func(string) (string, error)
		ok   bool
	}{
		{"empty", func(string) (string, error) { return "", nil }, false},
		{"CRLF injection", func(k string) (string, error) { return k + "\r\nX-Injected: 1", nil }, false},
		{"LF", func(k string) (string, error) { return k + "\nX-Injected: 1", nil }, false},
		{"NUL", func(k string) (string, error) { return k + "\x00", nil }, false},
		{"tab", func(k string) (string, error) { return k + "\t", nil }, false},
		{"DEL", func(k string) (string, error) { return k + "\x7f", nil }, false},
		{"non-ASCII", func(k string) (string, error) { return k + "é", nil }, false},
		{"1025 bytes", func(string) (string, error) { return strings.Repeat("k", 1025), nil }, false},
		{"an error", func(string) (string, error) { return "", errors.New("too long for us") }, false},
		{"an error and a form", func(k string) (string, error) { return k, errors.New("no") }, false},
		{"1024 bytes", func(string) (string, error) { return strings.Repeat("k", 1024), nil }, true},
		{"a prefix", func(k string) (string, error) { return "ord_" + k, nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
			srv := newServer(t, h)
			c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Key: tc.key}))
			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			if !tc.ok {
				assert.Nil(t, resp)
				require.ErrorIs(t, err, idempotency.ErrInvalidKey)
				assert.Empty(t, h.headers(), "requests sent")
				return
			}
			require.NoError(t, err)
			resp.Body.Close()
			want, _ := tc.key(outcome(t, resp).Key)
			assert.Equal(t, [][]string{{want}}, h.values("X-Key"))
			assert.Empty(t, h.values("X-Injected")[0])
		})
	}
}

// TestDialectKeyUnstable: a Key function that gives another form on each
// call is called once per call to Do, so that every attempt of one
// operation sends the same key.
func TestDialectKeyUnstable(t *testing.T) {
	var n atomic.Int64
	h := &headerLog{steps: []http.HandlerFunc{status(503), status(503), status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Key: func(k string) (string, error) {
		return k + "-" + string(rune('a'+n.Add(1))), nil
	}}))
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	got := h.values("X-Key")
	require.Len(t, got, 3)
	assert.Equal(t, [][]string{got[0], got[0], got[0]}, got)
	assert.EqualValues(t, 1, n.Load(), "Key calls")
}

// TestDialectChooserOncePerCall: the chooser is asked once per call to Do,
// whatever it answers on later calls: the key header cannot change between
// the attempts of one operation.
func TestDialectChooserOncePerCall(t *testing.T) {
	var n atomic.Int64
	h := &headerLog{steps: []http.HandlerFunc{status(503), status(503), status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, idempotency.WithDialect(func(*http.Request) idempotency.Dialect {
		if n.Add(1)%2 == 1 {
			return idempotency.Dialect{Header: "X-Odd"}
		}
		return idempotency.Dialect{Header: "X-Even"}
	}))
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	key := outcome(t, resp).Key
	assert.Equal(t, [][]string{{key}, {key}, {key}}, h.values("X-Odd"))
	assert.Equal(t, [][]string{nil, nil, nil}, h.values("X-Even"))
	assert.Equal(t, [][]string{nil, nil, nil}, h.values(hdrKey))
	assert.EqualValues(t, 1, n.Load(), "chooser calls")
}

// TestDialectChooserPanics: a chooser that panics refuses the request,
// closes its body, sends nothing.
func TestDialectChooserPanics(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	var logged bytes.Buffer
	c := newClient(t, srv,
		idempotency.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))),
		idempotency.WithDialect(func(*http.Request) idempotency.Dialect { panic("chooser bug") }))
	body := &closeTracker{Reader: strings.NewReader("x")}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	resp, err := c.Do(req)
	assert.Nil(t, resp)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "idempotency: "), "%q", err)
	assert.True(t, body.closed.Load())
	assert.Empty(t, h.headers())
	assert.Contains(t, logged.String(), "chooser bug")

	// Through StandardClient too.
	body = &closeTracker{Reader: strings.NewReader("x")}
	req, err = http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
	require.NoError(t, err)
	resp, err = c.StandardClient().Do(req)
	assert.Nil(t, resp)
	require.Error(t, err)
	assert.True(t, body.closed.Load())
	assert.Empty(t, h.headers())
}

// TestDialectBadHeaderNames: a Dialect whose Header is not a header name
// is refused.
func TestDialectBadHeaderNames(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	for _, name := range []string{"X Key", "X-Key\r\nX-Injected", "X-Kéy", "X-Key:", "(key)"} {
		c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: name}))
		_, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		assert.ErrorIs(t, err, idempotency.ErrInvalidKey, "%q", name)
	}
	assert.Empty(t, h.headers())
}

// TestDialectAnswerPanics: an Answer that panics says nothing: the
// response is judged by the policy alone, and returned.
func TestDialectAnswerPanics(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(503), status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Answer: func(*http.Response, []byte) (idempotency.EventKind, time.Duration, error) {
		panic("answer bug")
	}}))
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, "status 201", readAll(t, resp))
	o := outcome(t, resp)
	assert.Equal(t, 2, o.Attempts)
	assert.False(t, o.Replayed)
	assert.NoError(t, o.Stopped)
}

// TestDialectAnswerOddResults: kinds and errors that an Answer is not
// documented to return are ignored.
func TestDialectAnswerOddResults(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(400)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Answer: func(*http.Response, []byte) (idempotency.EventKind, time.Duration, error) {
		return idempotency.EventGaveUp, -time.Hour, errors.New("some other error")
	}}))
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o := outcome(t, resp)
	assert.Equal(t, 1, o.Attempts)
	assert.NoError(t, o.Stopped)
	assert.Equal(t, idempotency.EventCompleted, o.Kind)
	assert.False(t, o.Honoured)
}

// TestDialectReplayedRefusal: an answer that an Answer marks both as a
// replay and as a final refusal is the refusal: Outcome says it stopped
// with ErrKeyMismatch, and does not call it a replay of the operation.
func TestDialectReplayedRefusal(t *testing.T) {
	for _, final := range []error{idempotency.ErrKeyMismatch, idempotency.ErrOutcomeUnknown} {
		h := &headerLog{steps: []http.HandlerFunc{status(400)}}
		srv := newServer(t, h)
		var events []idempotency.Event
		c := newClient(t, srv,
			idempotency.WithObserver(func(_ context.Context, e idempotency.Event) { events = append(events, e) }),
			dialectOf(idempotency.Dialect{Header: "X-Key", Answer: func(*http.Response, []byte) (idempotency.EventKind, time.Duration, error) {
				return idempotency.EventReplayed, 0, final
			}}))
		resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
		require.NoError(t, err)
		resp.Body.Close()
		o := outcome(t, resp)
		assert.ErrorIs(t, o.Stopped, final)
		assert.False(t, o.Replayed, "%v: Replayed", final)
		assert.Equal(t, idempotency.EventCompleted, o.Kind, "%v: Kind", final)
		assert.True(t, o.Honoured)
		require.Len(t, events, 1)
		assert.Equal(t, idempotency.EventCompleted, events[0].Kind, "%v: event", final)
		assert.False(t, events[0].Replayed, "%v: event Replayed", final)
	}
}

// TestDialectReplayedError: a replay of an error status, which another
// attempt with the key would only get again (Stripe replays a stored 500),
// is what is returned.
func TestDialectReplayedError(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusInternalServerError, "Replayed", "true")}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
		if resp.Header.Get("Replayed") == "true" {
			return idempotency.EventReplayed, 0, nil
		}
		return 0, 0, nil
	}}))
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o := outcome(t, resp)
	assert.Equal(t, 1, o.Attempts)
	assert.True(t, o.Replayed)
	assert.Equal(t, idempotency.EventReplayed, o.Kind)
	assert.NoError(t, o.Stopped)

	// The zero Dialect's marker alike.
	h = &headerLog{steps: []http.HandlerFunc{status(http.StatusServiceUnavailable, hdrReplayed, "true")}}
	srv = newServer(t, h)
	resp, err = newClient(t, srv).Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o = outcome(t, resp)
	assert.Equal(t, 1, o.Attempts)
	assert.Equal(t, idempotency.EventReplayed, o.Kind)
}

// inFlightDialect answers every 409 as in flight, asking for wait.
func inFlightDialect(wait time.Duration) idempotency.Option {
	return dialectOf(idempotency.Dialect{Header: "X-Key", Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
		if resp.StatusCode == http.StatusConflict {
			return idempotency.EventRetried, wait, nil
		}
		return 0, 0, nil
	}})
}

// TestDialectInFlightWaits: the wait after an in-flight answer is the
// response's Retry-After when usable, else the Dialect's, never more than
// WithMaxRetryAfter; with WithMaxRetryAfter(0), the backoff.
func TestDialectInFlightWaits(t *testing.T) {
	date := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }
	for _, tc := range []struct {
		name       string
		retryAfter string
		dialect    time.Duration
		max        time.Duration
		want       func(time.Duration) bool
	}{
		{"Retry-After 0", "0", time.Hour, time.Second, func(w time.Duration) bool { return w == 0 }},
		{"Retry-After negative: the dialect's", "-5", 40 * time.Millisecond, time.Second, func(w time.Duration) bool { return w == 40*time.Millisecond }},
		{"Retry-After huge", "99999999999999999999999", 0, 30 * time.Millisecond, func(w time.Duration) bool { return w == 30*time.Millisecond }},
		{"Retry-After a past date", date(-time.Hour), time.Hour, time.Second, func(w time.Duration) bool { return w == 0 }},
		{"Retry-After a future date", date(time.Hour), 0, 25 * time.Millisecond, func(w time.Duration) bool { return w == 25*time.Millisecond }},
		{"Retry-After garbage: the dialect's", "soon", 40 * time.Millisecond, time.Second, func(w time.Duration) bool { return w == 40*time.Millisecond }},
		{"the dialect's, huge", "", 1 << 62, 35 * time.Millisecond, func(w time.Duration) bool { return w == 35*time.Millisecond }},
		{"the dialect's, negative: backoff", "", -time.Hour, time.Second, func(w time.Duration) bool { return w >= 0 && w <= 5*time.Millisecond }},
		{"max 0: backoff", "3", time.Hour, 0, func(w time.Duration) bool { return w >= 0 && w <= 5*time.Millisecond }},
		{"max 1ns", "3", time.Hour, 1, func(w time.Duration) bool { return w == 1 }},
		{"max 1ns, the dialect's", "", time.Hour, 1, func(w time.Duration) bool { return w == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conflict := func(w http.ResponseWriter, _ *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.WriteHeader(http.StatusConflict)
			}
			h := &headerLog{steps: []http.HandlerFunc{conflict, status(http.StatusCreated)}}
			srv := newServer(t, h)
			var r retries
			c := newClient(t, srv, inFlightDialect(tc.dialect), idempotency.WithMaxRetryAfter(tc.max), idempotency.WithObserver(r.hook))
			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			ev := r.all()
			require.Len(t, ev, 1)
			assert.True(t, tc.want(ev[0].Wait), "wait %v", ev[0].Wait)
			vs := h.values("X-Key")
			assert.Equal(t, vs[0], vs[1], "the same key")
		})
	}
}

// TestDialectCallerKeyUnderAnotherHeader: a key that the caller put under
// Idempotency-Key, for a Dialect whose key header is another, is refused
// before any attempt: the Client would otherwise send it beside a second
// key of its own, and the API would deduplicate on the Client's random
// one, not the caller's. A request with a key under the Dialect's header
// too, or of a method that gets no key, is the caller's to send.
func TestDialectCallerKeyUnderAnotherHeader(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "PayPal-Request-Id"}))
	for _, name := range []string{hdrKey, "idempotency-key"} {
		req := post(t, t.Context(), srv.URL, "x")
		req.Header[name] = []string{"order-42"}
		resp, err := c.Do(req)
		assert.Nil(t, resp)
		assert.ErrorIs(t, err, idempotency.ErrInvalidKey, name)
	}
	assert.Empty(t, h.headers(), "requests sent")

	req := post(t, t.Context(), srv.URL, "x")
	req.Header.Set(hdrKey, "order-42")
	req.Header.Set("PayPal-Request-Id", "order-42")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	req, err = http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	req.Header.Set(hdrKey, "order-42")
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, [][]string{{"order-42"}, {"order-42"}}, h.values(hdrKey))
	assert.Equal(t, [][]string{{"order-42"}, nil}, h.values("PayPal-Request-Id"))
}

// TestDialectCallerKeyTwoSpellings: a key under the dialect's header in two
// spellings is refused, as under the zero Dialect's.
func TestDialectCallerKeyTwoSpellings(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "PayPal-Request-Id"}))
	req := post(t, t.Context(), srv.URL, "x")
	req.Header["PayPal-Request-Id"] = []string{"a"}
	req.Header["paypal-request-id"] = []string{"b"}
	_, err := c.Do(req)
	assert.ErrorIs(t, err, idempotency.ErrInvalidKey)
	assert.Empty(t, h.headers())
}

// TestDialectCallerKeyChecked: a caller's key is checked with the
// dialect's Key, which may refuse it, and sent as it is.
func TestDialectCallerKeyChecked(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Key: func(k string) (string, error) {
		if len(k) > 8 {
			return "", errors.New("too long")
		}
		return "rewritten-" + k, nil
	}}))
	req := post(t, t.Context(), srv.URL, "x")
	req.Header.Set("X-Key", "123456789")
	_, err := c.Do(req)
	assert.ErrorIs(t, err, idempotency.ErrInvalidKey)
	req = post(t, t.Context(), srv.URL, "x")
	req.Header.Set("x-key", "1234")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, [][]string{{"1234"}}, h.values("X-Key"))
}

const (
	oasisID    = "Repeatability-Request-ID"
	oasisFirst = "Repeatability-First-Sent"
)

func oasis() idempotency.Option { return dialectOf(idempotency.Dialect{Header: oasisID}) }

// TestDialectOASISFirstSent: Repeatability-First-Sent is the same on every
// attempt of an operation: the call's start, the time ContextWithKey
// carries, or the caller's own header, which the Client never replaces.
func TestDialectOASISFirstSent(t *testing.T) {
	retry := []http.HandlerFunc{status(503), status(503), status(http.StatusCreated)}
	sendWith := func(t *testing.T, ctx context.Context, header http.Header) (*headerLog, idempotency.Outcome) {
		t.Helper()
		h := &headerLog{steps: retry}
		srv := newServer(t, h)
		req := post(t, ctx, srv.URL, "x")
		for k, vs := range header {
			req.Header[k] = vs
		}
		resp, err := newClient(t, srv, oasis()).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return h, outcome(t, resp)
	}
	fixed := func(t *testing.T, h *headerLog, want string) {
		t.Helper()
		got := h.values(oasisFirst)
		require.Len(t, got, 3)
		for i, vs := range got {
			assert.Equal(t, []string{want}, vs, "attempt %d", i+1)
		}
	}
	t.Run("the call's start", func(t *testing.T) {
		before := time.Now().Truncate(time.Second)
		h, _ := sendWith(t, t.Context(), nil)
		first := h.values(oasisFirst)[0][0]
		at, err := http.ParseTime(first)
		require.NoError(t, err)
		assert.False(t, at.Before(before))
		fixed(t, h, first)
	})
	t.Run("ContextWithKey without a time", func(t *testing.T) {
		before := time.Now().Truncate(time.Second)
		h, o := sendWith(t, idempotency.ContextWithKey(t.Context(), uuid.NewString()), nil)
		first := h.values(oasisFirst)[0][0]
		at, err := http.ParseTime(first)
		require.NoError(t, err)
		assert.False(t, at.Before(before))
		fixed(t, h, first)
		assert.Equal(t, [][]string{{o.Key}, {o.Key}, {o.Key}}, h.values(oasisID))
	})
	t.Run("ContextWithKey with a time, in another zone", func(t *testing.T) {
		at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.FixedZone("X", 3600))
		h, _ := sendWith(t, idempotency.ContextWithKey(t.Context(), uuid.NewString(), at), nil)
		fixed(t, h, "Sun, 01 Mar 2026 09:00:00 GMT")
	})
	t.Run("ContextWithKey with a time in the future", func(t *testing.T) {
		at := time.Now().Add(time.Hour)
		h, _ := sendWith(t, idempotency.ContextWithKey(t.Context(), uuid.NewString(), at), nil)
		fixed(t, h, at.UTC().Format(http.TimeFormat))
	})
	t.Run("the caller's header with a key from the context", func(t *testing.T) {
		first := "Sun, 01 Mar 2026 09:00:00 GMT"
		h, _ := sendWith(t, idempotency.ContextWithKey(t.Context(), uuid.NewString()), http.Header{oasisFirst: {first}})
		fixed(t, h, first)
	})
	t.Run("the caller's header in another case with a key from the context", func(t *testing.T) {
		first := "Sun, 01 Mar 2026 09:00:00 GMT"
		h, _ := sendWith(t, idempotency.ContextWithKey(t.Context(), uuid.NewString(), time.Now()), http.Header{"repeatability-first-sent": {first}})
		fixed(t, h, first)
	})
	t.Run("the caller's key and header", func(t *testing.T) {
		first := "Sun, 01 Mar 2026 09:00:00 GMT"
		h, _ := sendWith(t, t.Context(), http.Header{"repeatability-request-id": {"k-1"}, "repeatability-first-sent": {first}})
		fixed(t, h, first)
		assert.Equal(t, [][]string{{"k-1"}, {"k-1"}, {"k-1"}}, h.values(oasisID))
	})
	t.Run("the caller's key without a time", func(t *testing.T) {
		h, _ := sendWith(t, t.Context(), http.Header{oasisID: {"k-1"}})
		fixed(t, h, h.values(oasisFirst)[0][0])
	})
}

// TestDialectOASISFirstSentTwice: two first-sent times in the caller's
// header are refused, as two keys are, whoever makes the key.
func TestDialectOASISFirstSentTwice(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, oasis())
	for _, hd := range []http.Header{
		{oasisID: {"k-1"}, oasisFirst: {"Sun, 01 Mar 2026 09:00:00 GMT", "Sun, 01 Mar 2026 09:01:00 GMT"}},
		{oasisFirst: {"Sun, 01 Mar 2026 09:00:00 GMT"}, "repeatability-first-sent": {"Sun, 01 Mar 2026 09:01:00 GMT"}},
	} {
		body := &closeTracker{Reader: strings.NewReader("x")}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
		require.NoError(t, err)
		for k, vs := range hd {
			req.Header[k] = vs
		}
		resp, err := c.Do(req)
		assert.Nil(t, resp)
		assert.ErrorIs(t, err, idempotency.ErrInvalidKey)
		assert.True(t, body.closed.Load(), "request body closed")
	}
	assert.Empty(t, h.headers(), "requests sent")
}

// bodyAnswer is a Dialect whose Answer records the bodies it is given.
type bodyAnswer struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (b *bodyAnswer) option() idempotency.Option {
	return dialectOf(idempotency.Dialect{Header: "X-Key", Answer: func(resp *http.Response, body []byte) (idempotency.EventKind, time.Duration, error) {
		b.mu.Lock()
		b.bodies = append(b.bodies, append([]byte(nil), body...))
		b.mu.Unlock()
		if strings.Contains(string(body), `"in_use"`) {
			return idempotency.EventRetried, 0, nil
		}
		if strings.Contains(string(body), `"reused"`) {
			return 0, 0, idempotency.ErrKeyMismatch
		}
		return 0, 0, nil
	}})
}

// TestDialectAnswerHugeBody: Answer gets the first 4 KiB of a large body,
// and the caller all of it.
func TestDialectAnswerHugeBody(t *testing.T) {
	big := `{"error":"reused","pad":"` + strings.Repeat("x", 1<<20) + `"}`
	h := &headerLog{steps: []http.HandlerFunc{func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, big)
	}}}
	srv := newServer(t, h)
	var b bodyAnswer
	c := newClient(t, srv, b.option())
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, big, readAll(t, resp))
	require.Len(t, b.bodies, 1)
	assert.Equal(t, big[:4096], string(b.bodies[0]))
	assert.ErrorIs(t, outcome(t, resp).Stopped, idempotency.ErrKeyMismatch)
}

// TestDialectAnswerGzipBody: a response body compressed with gzip, which
// the Transport leaves compressed when the caller asked for it, reaches
// Answer decompressed (its start, when the compressed body is longer than
// what is read of it), and the caller as it came.
func TestDialectAnswerGzipBody(t *testing.T) {
	for _, doc := range []string{
		`{"error":"reused"}`,
		`{"error":"reused","pad":"` + strings.Repeat(uuid.NewString(), 1000) + `"}`,
	} {
		var zipped bytes.Buffer
		zw := gzip.NewWriter(&zipped)
		zw.Write([]byte(doc))
		zw.Close()
		h := &headerLog{steps: []http.HandlerFunc{func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write(zipped.Bytes())
		}}}
		srv := newServer(t, h)
		var b bodyAnswer
		c := newClient(t, srv, b.option())
		req := post(t, t.Context(), srv.URL, "x")
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := c.Do(req)
		require.NoError(t, err)
		assert.Equal(t, zipped.String(), readAll(t, resp))
		require.Len(t, b.bodies, 1)
		got := string(b.bodies[0])
		assert.LessOrEqual(t, len(got), 4096)
		assert.True(t, len(got) >= min(len(doc), 100) && strings.HasPrefix(doc, got), "Answer's body: %.40q", got)
		assert.ErrorIs(t, outcome(t, resp).Stopped, idempotency.ErrKeyMismatch)
	}
}

// TestDialectAnswerStalledBody: the body of a returned error response
// whose start stalls reaches the caller whole, however long it stalls:
// Answer is read within the drain bound, and the body is not cut for it.
func TestDialectAnswerStalledBody(t *testing.T) {
	release := make(chan struct{})
	h := &headerLog{steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":`)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, `"reused"}`)
	}}}
	srv := newServer(t, h)
	var b bodyAnswer
	c := newClient(t, srv, b.option())
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	close(release)
	assert.Equal(t, `{"error":"reused"}`, readAll(t, resp))
}

// TestDialectAnswerStalledDiscarded: an error response that is retried,
// whose body stalls, does not hold up the retry.
func TestDialectAnswerStalledDiscarded(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":`)
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}, status(http.StatusCreated)}}
	srv := newServer(t, h)
	var b bodyAnswer
	c := newClient(t, srv, b.option())
	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, "status 201", readAll(t, resp))
	assert.Equal(t, 2, outcome(t, resp).Attempts)
	require.Len(t, b.bodies, 2)
	assert.Equal(t, `{"error":`, string(b.bodies[0]))
}

// TestDialectRejectsDerivedKey: inside a handler, a Dialect whose Key
// refuses the derived key's form (a version 8 UUID, where a version 4 is
// wanted) refuses the request before any attempt; it never falls back to
// another key, which a rerun of the handler would not send again.
func TestDialectRejectsDerivedKey(t *testing.T) {
	h := &headerLog{steps: []http.HandlerFunc{status(http.StatusCreated)}}
	srv := newServer(t, h)
	c := newClient(t, srv, dialectOf(idempotency.Dialect{Header: "X-Key", Key: func(k string) (string, error) {
		if u, err := uuid.Parse(k); err != nil || u.Version() != 4 {
			return "", errors.New("a version 4 UUID, please")
		}
		return k, nil
	}}))
	ctx := idempotency.ContextWithStep(handling(t.Context(), "tenant-a", "order-17"), "charge")
	resp, err := c.Do(post(t, ctx, srv.URL, "x"))
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, idempotency.ErrInvalidKey)
	assert.Empty(t, h.headers())

	// Outside a handler, the Client's own key is a version 4 UUID.
	resp, err = c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Len(t, h.headers(), 1)
}
