package idempotency_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

func TestTLSCertificateNotRetried(t *testing.T) {
	s := newScript(status(http.StatusCreated))
	srv := httptest.NewUnstartedServer(s)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tr := &http.Transport{} // trusts the system roots, not the test server
	t.Cleanup(tr.CloseIdleConnections)
	c := clienttest.New(t, idempotency.WithHTTPClient(&http.Client{Transport: tr}))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	assert.Nil(t, resp)
	var certErr *tls.CertificateVerificationError
	require.ErrorAs(t, err, &certErr)
	var re *idempotency.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Attempts)
	assert.Zero(t, s.hits.Load(), "server hits")
}

func TestRedirects(t *testing.T) {
	hits := new(atomic.Int64)
	mux := http.NewServeMux()
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, "ftp://example.com/file", http.StatusFound)
	})
	srv := newServer(t, mux)
	refused := errors.New("no redirects here")

	tests := []struct {
		name     string
		path     string
		check    func(*http.Request, []*http.Request) error
		want     error
		wantHits int64
	}{
		{"loop, default policy", "/loop", nil, idempotency.ErrRedirect, 10},
		{"caller's policy", "/loop", func(*http.Request, []*http.Request) error { return refused }, refused, 1},
		{"unsupported scheme", "/elsewhere", nil, idempotency.ErrInvalidURL, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hits.Store(0)
			hc := srv.Client()
			hc.CheckRedirect = tt.check
			c := clienttest.New(t, idempotency.WithHTTPClient(hc))

			resp, err := c.Do(post(t, t.Context(), srv.URL+tt.path, "x"))
			assert.Nil(t, resp)
			assert.ErrorIs(t, err, tt.want)
			if tt.check != nil {
				assert.ErrorIs(t, err, idempotency.ErrRedirect)
			}
			var re *idempotency.RetryError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, 1, re.Attempts)
			assert.Equal(t, tt.wantHits, hits.Load(), "server hits")
		})
	}

	t.Run("ErrUseLastResponse", func(t *testing.T) {
		hc := srv.Client()
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		c := clienttest.New(t, idempotency.WithHTTPClient(hc))

		resp, err := c.Do(post(t, t.Context(), srv.URL+"/loop", "x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusFound, resp.StatusCode)
		assert.Equal(t, 1, outcome(t, resp).Attempts)
	})
}

func TestStandardClient(t *testing.T) {
	ks := &keyServer{lose: 1}
	srv := newServer(t, ks)
	c := newClient(t, srv)
	hc := c.StandardClient()

	resp, err := hc.Post(srv.URL, "application/json", strings.NewReader(`{"amount":10}`))
	require.NoError(t, err)
	assert.Equal(t, `{"order":1}`, readAll(t, resp))
	o := outcome(t, resp)
	assert.Equal(t, 2, o.Attempts)
	assert.True(t, o.Replayed)
	attempts, executions, keys := ks.stats()
	assert.Equal(t, 2, attempts)
	assert.Equal(t, 1, executions)
	assert.Equal(t, []string{o.Key, o.Key}, keys)

	// Errors are wrapped once by the http.Client, as its Transport's are.
	ks2 := &keyServer{lose: 100}
	srv2 := newServer(t, ks2)
	_, err = newClient(t, srv2, idempotency.WithMaxAttempts(2)).StandardClient().Post(srv2.URL, "text/plain", strings.NewReader("x"))
	require.Error(t, err)
	var re *idempotency.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 2, re.Attempts)
	assert.Equal(t, 1, strings.Count(err.Error(), srv2.URL), "Error() = %q", err)
}

func TestStandardClientRedirects(t *testing.T) {
	hits := new(atomic.Int64)
	mux := http.NewServeMux()
	mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
	})
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	srv := newServer(t, mux)
	hc := newClient(t, srv).StandardClient()

	resp, err := hc.Post(srv.URL+"/old", "text/plain", strings.NewReader("payload"))
	require.NoError(t, err)
	assert.Equal(t, "payload", readAll(t, resp))
	assert.Equal(t, 1, outcome(t, resp).Attempts)
	assert.EqualValues(t, 2, hits.Load())

	hits.Store(0)
	_, err = hc.Get(srv.URL + "/loop")
	require.Error(t, err)
	assert.EqualValues(t, 10, hits.Load(), "a redirect loop is followed once, not once per retry")
}

func TestTransport(t *testing.T) {
	s := newScript(status(http.StatusBadGateway), status(http.StatusOK))
	srv := newServer(t, s)
	c := newClient(t, srv)
	hc := &http.Client{Transport: c.StandardClient().Transport}

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPatch, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	o := outcome(t, resp)
	assert.Equal(t, 2, o.Attempts)
	assert.Equal(t, []string{o.Key, o.Key}, s.keysSeen())
}

// closeCounter is a shared transport that counts calls to
// CloseIdleConnections and closes of response bodies.
type closeCounter struct {
	*http.Transport
	idleCloses atomic.Int64
	bodyCloses atomic.Int64
	bodies     atomic.Int64
}

func (c *closeCounter) CloseIdleConnections() {
	c.idleCloses.Add(1)
	c.Transport.CloseIdleConnections()
}

func (c *closeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.Transport.RoundTrip(req)
	if err == nil {
		c.bodies.Add(1)
		resp.Body = &countingBody{ReadCloser: resp.Body, closes: &c.bodyCloses}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	closes *atomic.Int64
}

func (b *countingBody) Close() error {
	b.closes.Add(1)
	return b.ReadCloser.Close()
}

func TestSharedTransportKept(t *testing.T) {
	s := newScript(status(http.StatusOK))
	var conns atomic.Int64
	srv := newServer(t, s, func(hs *http.Server) {
		hs.ConnState = func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				conns.Add(1)
			}
		}
	})
	tr := &closeCounter{Transport: srv.Client().Transport.(*http.Transport).Clone()}
	t.Cleanup(tr.Transport.CloseIdleConnections)
	c := newClient(t, srv, idempotency.WithHTTPClient(&http.Client{Transport: tr}), idempotency.WithMaxAttempts(3))
	do := func(c *idempotency.Client, ctx context.Context) (idempotency.Outcome, error) {
		t.Helper()
		resp, err := c.Do(post(t, ctx, srv.URL, "x"))
		if err != nil {
			return idempotency.Outcome{}, err
		}
		readAll(t, resp)
		return outcome(t, resp), nil
	}

	_, err := do(c, t.Context())
	require.NoError(t, err)
	// A request that fails: every attempt gets 503.
	s.set(0, status(http.StatusServiceUnavailable))
	o, err := do(c, t.Context())
	require.NoError(t, err)
	assert.ErrorIs(t, o.Stopped, idempotency.ErrAttemptsExhausted)
	// The next one still uses the first connection.
	s.set(0, status(http.StatusOK))
	_, err = do(c, t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 1, conns.Load(), "connections")

	// Requests that end without a response: lost ones, and one whose
	// context is canceled before a retry.
	s.set(0, lost)
	_, err = do(c, t.Context())
	require.Error(t, err)
	s.set(0, status(http.StatusServiceUnavailable, "Retry-After", "10"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c2 := newClient(t, srv, idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		onRetry(cancel))
	_, err = do(c2, ctx)
	require.ErrorIs(t, err, context.Canceled)

	assert.Zero(t, tr.idleCloses.Load(), "CloseIdleConnections calls")
	assert.Equal(t, tr.bodies.Load(), tr.bodyCloses.Load(), "response bodies closed")
}

func TestDiscardedBodiesClosed(t *testing.T) {
	big := strings.Repeat("e", 64<<10) // more than the engine drains
	s := newScript(
		func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, big)
		},
		status(http.StatusInternalServerError),
		status(http.StatusCreated),
	)
	srv := newServer(t, s)
	tr := &closeCounter{Transport: srv.Client().Transport.(*http.Transport).Clone()}
	t.Cleanup(tr.Transport.CloseIdleConnections)
	c := newClient(t, srv, idempotency.WithHTTPClient(&http.Client{Transport: tr}))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	assert.EqualValues(t, 3, tr.bodies.Load())
	assert.EqualValues(t, 2, tr.bodyCloses.Load(), "bodies closed before the caller's")
	readAll(t, resp)
	assert.EqualValues(t, 3, tr.bodyCloses.Load())
}

func TestSwitchingProtocols(t *testing.T) {
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString(line)
		brw.Flush()
	}))
	c := newClient(t, srv)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")

	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	rw, ok := resp.Body.(io.ReadWriteCloser)
	require.True(t, ok, "the body of a 101 response is writable")
	_, err = io.WriteString(rw, "ping\n")
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(rw, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping\n", string(buf))
}

func TestMaxAttemptsOne(t *testing.T) {
	s := newScript(status(http.StatusServiceUnavailable))
	srv := newServer(t, s)
	_, err := idempotency.NewClient(idempotency.WithMaxAttempts(0))
	require.Error(t, err, "below one attempt")
	c := newClient(t, srv, idempotency.WithMaxAttempts(1))

	resp, err := c.Do(post(t, t.Context(), srv.URL, "x"))
	require.NoError(t, err)
	resp.Body.Close()
	o := outcome(t, resp)
	assert.Equal(t, 1, o.Attempts)
	assert.ErrorIs(t, o.Stopped, idempotency.ErrAttemptsExhausted)
	assert.EqualValues(t, 1, s.hits.Load())
}

func TestStalledDiscardedBody(t *testing.T) {
	tests := []struct {
		name string
		opts []idempotency.Option
		do   func(*idempotency.Client, *http.Request) (*http.Response, error)
	}{
		{"Do", nil, (*idempotency.Client).Do},
		{"Do without attempt timeout", []idempotency.Option{idempotency.WithAttemptTimeout(0)}, (*idempotency.Client).Do},
		{"StandardClient", nil, func(c *idempotency.Client, req *http.Request) (*http.Response, error) {
			return c.StandardClient().Do(req)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			// A 503 whose body stalls after its first bytes, until the
			// client gives up on the connection.
			stall := func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, "overloa")
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}
			s := newScript(stall, status(http.StatusCreated))
			srv := newServer(t, s)
			t.Cleanup(func() { close(release) })
			c := newClient(t, srv, tt.opts...)
			// Without a bound on the drain, the call would last until this
			// deadline and end in an error.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()

			resp, err := tt.do(c, post(t, ctx, srv.URL, "x"))
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			assert.Equal(t, "status 201", readAll(t, resp))
			assert.Equal(t, 2, outcome(t, resp).Attempts)
			assert.NoError(t, ctx.Err(), "the call lasted until the deadline")
		})
	}
}

// rudeTransport breaks the RoundTripper contract: it returns no response
// and no error, or a response without a body.
type rudeTransport struct{ nilResponse bool }

func (r rudeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	if r.nilResponse {
		return nil, nil
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Request: req}, nil
}

func TestRudeTransport(t *testing.T) {
	for _, nilResponse := range []bool{true, false} {
		for _, ctx := range []context.Context{context.Background(), t.Context()} {
			c := clienttest.New(t, idempotency.WithHTTPClient(&http.Client{Transport: rudeTransport{nilResponse}}),
				idempotency.WithMaxAttempts(1))
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.example/orders", strings.NewReader("x"))
			require.NoError(t, err)

			resp, err := c.Do(req)
			if nilResponse {
				assert.ErrorContains(t, err, "nil *Response")
				continue
			}
			require.NoError(t, err)
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			b, err := io.ReadAll(resp.Body)
			assert.NoError(t, err)
			assert.Empty(t, b)
			assert.NoError(t, resp.Body.Close())
		}
	}
}
