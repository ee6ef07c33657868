package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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

func TestLostResponse(t *testing.T) {
	tests := []struct {
		name   string
		server *keyServer
		opts   []idempotency.Option
	}{
		{"connection closed after the handler ran", &keyServer{lose: 1}, nil},
		{"two responses lost", &keyServer{lose: 2}, nil},
		{
			"response delayed past the attempt timeout", &keyServer{delay: 1},
			[]idempotency.Option{idempotency.WithAttemptTimeout(250 * time.Millisecond)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, tt.server)
			c := newClient(t, srv, tt.opts...)

			resp, err := c.Do(post(t, t.Context(), srv.URL+"/orders", `{"amount":10}`))
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, `{"order":1}`, readAll(t, resp))

			o := outcome(t, resp)
			attempts, executions, keys := tt.server.stats()
			assert.Equal(t, tt.server.lose+tt.server.delay+1, attempts, "server attempts")
			assert.Equal(t, 1, executions, "server executions")
			assert.Equal(t, attempts, o.Attempts, "Outcome.Attempts")
			assert.True(t, o.Replayed, "Outcome.Replayed")
			assert.NoError(t, o.Stopped)
			for i, k := range keys {
				assert.Equal(t, o.Key, k, "key of attempt %d", i+1)
			}
			assert.NoError(t, uuid.Validate(o.Key), "key %q is not a UUID", o.Key)
			for i, b := range tt.server.bodies {
				assert.Equal(t, `{"amount":10}`, b, "body of attempt %d", i+1)
			}
		})
	}
}

func TestAttemptTimeoutError(t *testing.T) {
	srv := newServer(t, &keyServer{delay: 10})
	var r retries
	c := newClient(t, srv, idempotency.WithAttemptTimeout(20*time.Millisecond),
		idempotency.WithMaxAttempts(2), idempotency.WithObserver(r.hook))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.Error(t, err)
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, idempotency.ErrAttemptTimeout)
	assert.ErrorIs(t, err, idempotency.ErrAttemptsExhausted)
	assert.NotErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	assert.True(t, ue.Timeout(), "url.Error.Timeout() = false, want true")

	infos := r.all()
	require.Len(t, infos, 1)
	assert.ErrorIs(t, infos[0].Err, idempotency.ErrAttemptTimeout)
}

func TestAttemptTimeoutDoesNotCutBody(t *testing.T) {
	release := make(chan struct{})
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("first half,"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Write([]byte(" second half"))
	}))
	c := newClient(t, srv, idempotency.WithAttemptTimeout(50*time.Millisecond))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	// Reading the body outlives the attempt timeout many times over.
	buf := make([]byte, len("first half,"))
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	time.AfterFunc(500*time.Millisecond, func() { close(release) })
	assert.Equal(t, "first half, second half", string(buf)+readAll(t, resp))
}

func TestStatuses(t *testing.T) {
	tests := []struct {
		code  int
		retry bool
	}{
		{http.StatusRequestTimeout, true},
		{http.StatusTooEarly, true},
		{http.StatusTooManyRequests, true},
		{http.StatusInternalServerError, true},
		{http.StatusBadGateway, true},
		{http.StatusServiceUnavailable, true},
		{http.StatusGatewayTimeout, true},
		{http.StatusBadRequest, false},
		{http.StatusConflict, false}, // without Retry-After or an in-flight problem: a business conflict
		{http.StatusUnauthorized, false},
		{http.StatusNotFound, false},
		{http.StatusUnprocessableEntity, false},
		{http.StatusNotImplemented, false},
		{http.StatusHTTPVersionNotSupported, false},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.code), func(t *testing.T) {
			s := newScript(status(tt.code), status(http.StatusCreated))
			srv := newServer(t, s)
			c := newClient(t, srv)

			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			defer resp.Body.Close()
			o := outcome(t, resp)
			if tt.retry {
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, 2, o.Attempts, "Attempts")
				keys := s.keysSeen()
				require.Len(t, keys, 2)
				assert.Equal(t, keys[0], keys[1], "key of the retry")
			} else {
				assert.Equal(t, tt.code, resp.StatusCode)
				assert.Equal(t, 1, o.Attempts, "Attempts")
				assert.EqualValues(t, 1, s.hits.Load(), "server hits")
			}
			assert.NoError(t, o.Stopped)
		})
	}
}

func TestConflictThenCreated(t *testing.T) {
	s := newScript(status(http.StatusConflict, "Retry-After", "0"), status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, "status 201", readAll(t, resp))
	assert.Equal(t, 2, outcome(t, resp).Attempts)
}

func TestLastResponseReturned(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable, "X-Attempt", "last"))
	srv := newServer(t, s)
	c := newClient(t, srv, idempotency.WithMaxAttempts(3))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "status 503", readAll(t, resp), "body of the last response")
	o := outcome(t, resp)
	assert.Equal(t, 3, o.Attempts)
	assert.ErrorIs(t, o.Stopped, idempotency.ErrAttemptsExhausted)
	assert.EqualValues(t, 3, s.hits.Load())
}

func TestTransportErrorsExhausted(t *testing.T) {
	s := newScript(lost)
	srv := newServer(t, s)
	c := newClient(t, srv, idempotency.WithMaxAttempts(3))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.Error(t, err)
	assert.Nil(t, resp)
	var re *idempotency.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 3, re.Attempts)
	assert.NotEmpty(t, re.Key)
	assert.ErrorIs(t, err, idempotency.ErrAttemptsExhausted)
	var ue *url.Error
	assert.ErrorAs(t, err, &ue, "the last attempt's error")
	assert.True(t, strings.HasPrefix(err.Error(), "idempotency: 3 attempts with key "), "Error() = %q", err)
	assert.EqualValues(t, 3, s.hits.Load())
}

func TestInvalidInput(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusCreated)))
	s := srv.Config.Handler.(*script)
	long := strings.Repeat("k", keyfield.MaxLen+1)
	tests := []struct {
		name    string
		url     string
		header  []string
		ctxKey  *string
		want    error
		dialect idempotency.Dialect
	}{
		{name: "relative URL", url: "/orders", want: idempotency.ErrInvalidURL},
		{name: "scheme", url: "ftp://example.com/x", want: idempotency.ErrInvalidURL},
		{name: "no host", url: "http:///x", want: idempotency.ErrInvalidURL},
		{name: "empty header key", header: []string{""}, want: idempotency.ErrInvalidKey},
		{name: "header key of 256 bytes", header: []string{long}, want: idempotency.ErrInvalidKey},
		{name: "control character in header key", header: []string{"a\x01b"}, want: idempotency.ErrInvalidKey},
		{name: "two header keys", header: []string{"a", "b"}, want: idempotency.ErrInvalidKey},
		{name: "empty context key", ctxKey: ptr(""), want: idempotency.ErrInvalidKey},
		{name: "context key of 256 bytes", ctxKey: ptr(long), want: idempotency.ErrInvalidKey},
		{name: "newline in context key", ctxKey: ptr("a\nb"), want: idempotency.ErrInvalidKey},
		{name: "dialect's form", dialect: idempotency.Dialect{Key: func(string) (string, error) { return "a\nb", nil }}, want: idempotency.ErrInvalidKey},
		{name: "dialect refuses", dialect: idempotency.Dialect{Key: func(string) (string, error) { return "", errors.New("too long") }}, want: idempotency.ErrInvalidKey},
		{name: "dialect refuses the header's key", header: []string{"k"}, dialect: idempotency.Dialect{Key: func(string) (string, error) { return "", errors.New("too short") }}, want: idempotency.ErrInvalidKey},
		{name: "dialect header", dialect: idempotency.Dialect{Header: "Bad Header"}, want: idempotency.ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []idempotency.Option
			if tt.dialect.Header != "" || tt.dialect.Key != nil {
				opts = append(opts, idempotency.WithDialect(func(*http.Request) idempotency.Dialect { return tt.dialect }))
			}
			c := newClient(t, srv, opts...)
			ctx := t.Context()
			if tt.ctxKey != nil {
				ctx = idempotency.ContextWithKey(ctx, *tt.ctxKey)
			}
			body := &closeTracker{Reader: strings.NewReader("x")}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, body)
			require.NoError(t, err)
			if tt.url != "" {
				req.URL, err = url.Parse(tt.url)
				require.NoError(t, err)
			}
			if tt.header != nil {
				req.Header[hdrKey] = tt.header
			}

			resp, err := c.Do(req)
			assert.Nil(t, resp)
			assert.ErrorIs(t, err, tt.want)
			assert.True(t, strings.HasPrefix(err.Error(), "idempotency: "), "Error() = %q", err)
			assert.True(t, body.closed.Load(), "request body closed")
		})
	}
	assert.Zero(t, s.hits.Load(), "server hits")

	t.Run("nil request", func(t *testing.T) {
		resp, err := newClient(t, srv).Do(nil)
		assert.Nil(t, resp)
		assert.EqualError(t, err, "idempotency: nil request")
	})
	t.Run("nil URL", func(t *testing.T) {
		_, err := newClient(t, srv).Do(&http.Request{Method: http.MethodGet})
		assert.ErrorIs(t, err, idempotency.ErrInvalidURL)
	})
	t.Run("Post with an unparsable URL", func(t *testing.T) {
		_, err := newClient(t, srv).Post(t.Context(), "http://[::1", "text/plain", nil)
		assert.ErrorIs(t, err, idempotency.ErrInvalidURL)
	})
}

func ptr[T any](v T) *T { return &v }

func TestRequestUnmodified(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable), status(http.StatusCreated))
	srv := newServer(t, s)
	c := newClient(t, srv)

	body := &closeTracker{Reader: strings.NewReader("payload")}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/orders?x=1", body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Authorization", "Bearer secret")
	wantHeader := req.Header.Clone()
	wantURL := *req.URL
	urlPtr, ctx := req.URL, req.Context()

	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 2, outcome(t, resp).Attempts)

	assert.Equal(t, wantHeader, req.Header, "header")
	assert.NotContains(t, req.Header, hdrKey)
	assert.Same(t, body, req.Body, "Body")
	assert.Nil(t, req.GetBody, "GetBody")
	assert.Same(t, urlPtr, req.URL, "URL pointer")
	assert.Equal(t, wantURL, *req.URL, "URL")
	assert.Zero(t, req.ContentLength, "ContentLength")
	assert.Equal(t, ctx, req.Context(), "context")
	assert.True(t, body.closed.Load(), "body closed")
}

func TestPost(t *testing.T) {
	contentType := make(chan string, 1)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contentType <- r.Header.Get("Content-Type")
		w.WriteHeader(http.StatusCreated)
	}))
	c := newClient(t, srv)

	resp, err := c.Post(t.Context(), srv.URL, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "application/json", <-contentType)
	assert.NotEmpty(t, outcome(t, resp).Key)
}

func TestZeroClient(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable, "Retry-After", "0"), status(http.StatusCreated))
	srv := newServer(t, s)
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)

	var c idempotency.Client
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			resp, err := c.Post(t.Context(), srv.URL, "text/plain", strings.NewReader("x"))
			if !assert.NoError(t, err) {
				return
			}
			resp.Body.Close()
			o, _ := idempotency.OutcomeOf(resp)
			assert.NotEmpty(t, o.Key)
		})
	}
	wg.Wait()
	assert.EqualValues(t, 5, s.hits.Load())
}

func TestOutcomeOfForeignResponse(t *testing.T) {
	srv := newServer(t, newScript(status(http.StatusOK)))
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	_, ok := idempotency.OutcomeOf(resp)
	assert.False(t, ok)
	_, ok = idempotency.OutcomeOf(nil)
	assert.False(t, ok)
	_, ok = idempotency.OutcomeOf(&http.Response{})
	assert.False(t, ok)
}

func TestRetryErrorUnwrap(t *testing.T) {
	last := errors.New("connection reset")
	err := error(&idempotency.RetryError{Key: "k", Attempts: 2, Err: last, Stopped: idempotency.ErrBudgetExhausted})
	assert.ErrorIs(t, err, last)
	assert.ErrorIs(t, err, idempotency.ErrBudgetExhausted)
	assert.Equal(t, `idempotency: 2 attempts with key "k", then retry budget exhausted: connection reset`, err.Error())

	err = &idempotency.RetryError{Attempts: 1, Err: last}
	assert.Equal(t, `idempotency: 1 attempt: connection reset`, err.Error())
}

func TestHTTPClientTimeoutWithAttemptTimeout(t *testing.T) {
	tests := []struct {
		name           string
		clientTimeout  time.Duration
		attemptTimeout time.Duration
		wantAttemptErr bool // the attempt timeout fires first
	}{
		{"http.Client's Timeout first", 250 * time.Millisecond, time.Minute, false},
		{"attempt timeout first", time.Minute, 250 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, &keyServer{delay: 1})
			var r retries
			hc := &http.Client{Transport: srv.Client().Transport, Timeout: tt.clientTimeout}
			c := newClient(t, srv, idempotency.WithHTTPClient(hc), idempotency.WithAttemptTimeout(tt.attemptTimeout),
				idempotency.WithObserver(r.hook))

			resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
			require.NoError(t, err)
			assert.Equal(t, `{"order":1}`, readAll(t, resp))
			assert.Equal(t, 2, outcome(t, resp).Attempts)
			infos := r.all()
			require.Len(t, infos, 1)
			var ue *url.Error
			require.ErrorAs(t, infos[0].Err, &ue)
			assert.True(t, ue.Timeout(), "the first attempt's error %v is not a timeout", infos[0].Err)
			assert.Equal(t, tt.wantAttemptErr, errors.Is(infos[0].Err, idempotency.ErrAttemptTimeout),
				"the first attempt's error %v matches ErrAttemptTimeout", infos[0].Err)
		})
	}
}

func TestCallerCancelsDuringBody(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("attempt timeout %v", timeout), func(t *testing.T) {
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte("first half,"))
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			c := newClient(t, srv, idempotency.WithAttemptTimeout(timeout))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()

			resp, err := c.Do(post(t, ctx, srv.URL, "x"))
			require.NoError(t, err)
			defer resp.Body.Close()
			buf := make([]byte, len("first half,"))
			_, err = io.ReadFull(resp.Body, buf)
			require.NoError(t, err)
			cancel()
			_, err = io.ReadAll(resp.Body)
			assert.ErrorIs(t, err, context.Canceled, "reading the rest after the caller canceled")
		})
	}
}

// TestNewClientValidates: invalid options make NewClient fail, naming each
// with the package's prefix, and make no Client.
func TestNewClientValidates(t *testing.T) {
	c, err := idempotency.NewClient(
		idempotency.WithMaxAttempts(0),
		idempotency.WithBackoff(time.Second, time.Millisecond),
		idempotency.WithAttemptTimeout(-time.Second),
		idempotency.WithMaxBufferedBody(-1),
		idempotency.WithDialect(nil),
		idempotency.WithRetryPolicy(nil),
		idempotency.WithMethods(),
		nil,
		idempotency.WithObserver(nil),
		idempotency.WithLogger(nil),
		idempotency.WithMethods("POST", ""),
	)
	require.Error(t, err)
	assert.Nil(t, c)
	lines := strings.Split(err.Error(), "\n")
	assert.Len(t, lines, 11, "one line per invalid option: %q", err)
	assert.Contains(t, err.Error(), "option 7 is nil")
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "idempotency: "), "line %q has no package prefix", l)
	}
	for _, ok := range []idempotency.Option{
		idempotency.WithMaxAttempts(1),
		idempotency.WithBackoff(0, 0),
		idempotency.WithAttemptTimeout(0),
		idempotency.WithMaxRetryAfter(0),
		idempotency.WithMaxBufferedBody(0),
		idempotency.WithBudget(nil),
	} {
		_, err := idempotency.NewClient(ok)
		assert.NoError(t, err)
	}
}
