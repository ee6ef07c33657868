package faultnet_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echo is an upstream that counts the requests it has handled, counting each
// before it writes the response, and answers 200 with the request's body.
type echo struct {
	ran atomic.Int64
	srv *httptest.Server
}

func newEcho(t *testing.T) *echo {
	t.Helper()
	e := &echo{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e.ran.Add(1)
		_, _ = w.Write(body)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// start starts a proxy in front of upstream and closes it when the test ends
// (before the upstream, as cleanups run last-in first-out).
func start(t *testing.T, upstream string, cfg faultnet.Config) *faultnet.Proxy {
	t.Helper()
	p, err := faultnet.Start(upstream, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// always returns a Decide that gives every request f.
func always(f faultnet.Fault) func(int64, *http.Request) faultnet.Fault {
	return func(int64, *http.Request) faultnet.Fault { return f }
}

// newClient returns a client with a transport of its own, so that no
// connection is shared with another test.
func newClient(t *testing.T, timeout time.Duration) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

// post sends a POST that net/http's Transport will not replay by itself (no
// Idempotency-Key), so that one call is one request at the proxy.
func post(c *http.Client, url, body string) (int, string, error) {
	resp, err := c.Post(url, "text/plain", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitFor receives from ch, or fails the test if nothing arrives within d.
func waitFor[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("no %s within %v", what, d)
		var zero T
		return zero
	}
}

// Deadlines for waitFor: prompt is for Close, which must not wait on held
// responses or a hanging upstream; patient is for anything else.
const (
	prompt  = 5 * time.Second
	patient = 10 * time.Second
)

func TestFaultString(t *testing.T) {
	tests := []struct {
		f    faultnet.Fault
		want string
	}{
		{faultnet.Pass, "pass"},
		{faultnet.Drop, "drop"},
		{faultnet.Reset, "reset"},
		{faultnet.Delay, "delay"},
		{faultnet.Fault(9), "Fault(9)"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.f.String())
	}
}

func TestStartRejects(t *testing.T) {
	up := newEcho(t).srv.URL
	tests := []struct {
		name     string
		upstream string
		cfg      faultnet.Config
	}{
		{"negative rate", up, faultnet.Config{DropRate: -0.1}},
		{"rate above one", up, faultnet.Config{ResetRate: 1.5}},
		{"NaN rate", up, faultnet.Config{DelayRate: math.NaN()}},
		{"rates above one", up, faultnet.Config{DropRate: 0.5, ResetRate: 0.3, DelayRate: 0.3}},
		{"negative delay", up, faultnet.Config{Delay: -time.Second}},
		{"no scheme", "127.0.0.1:80", faultnet.Config{}},
		{"https", "https://127.0.0.1:443", faultnet.Config{}},
		{"query", up + "/?a=b", faultnet.Config{}},
		{"unparsable", "http://[::1", faultnet.Config{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := faultnet.Start(tt.upstream, tt.cfg)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.True(t, strings.HasPrefix(err.Error(), "faultnet: "), "error %q lacks the package prefix", err)
		})
	}

	t.Run("rates adding up to one despite rounding", func(t *testing.T) {
		start(t, up, faultnet.Config{DropRate: 0.1, ResetRate: 0.2, DelayRate: 0.7})
	})
}

func TestPassForwardsExactly(t *testing.T) {
	type seen struct {
		method, uri, host, body string
		header                  http.Header
	}
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Host, string(body), r.Header.Clone()}
		w.Header()["X-Multi"] = []string{"a", "b"}
		w.Header().Set("Set-Cookie", "s=1")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Proxy-Foo", "x")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":42}`)
	}))
	t.Cleanup(up.Close)
	p := start(t, up.URL, faultnet.Config{})

	req, err := http.NewRequest(http.MethodPatch, p.URL()+"/orders/a%2Fb?x=1&y=%20&x=2", strings.NewReader(`{"qty":3}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", `"8e03978e-40d5"`)
	req.Header.Set("Authorization", "Bearer secret")
	req.Header["X-Multi"] = []string{"one", "two"}
	req.Header.Set("User-Agent", "faultnet-test/1")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "per-connection")
	req.Header.Set("Proxy-Authorization", "Basic cHJveHk=")
	resp, err := newClient(t, 10*time.Second).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	s := waitFor(t, got, patient, "upstream request")
	assert.Equal(t, http.MethodPatch, s.method)
	assert.Equal(t, "/orders/a%2Fb?x=1&y=%20&x=2", s.uri)
	assert.Equal(t, strings.TrimPrefix(p.URL(), "http://"), s.host, "Host")
	assert.Equal(t, `{"qty":3}`, s.body)
	assert.Equal(t, []string{`"8e03978e-40d5"`}, s.header["Idempotency-Key"])
	assert.Equal(t, []string{"Bearer secret"}, s.header["Authorization"])
	assert.Equal(t, []string{"one", "two"}, s.header["X-Multi"])
	assert.Equal(t, []string{"faultnet-test/1"}, s.header["User-Agent"])
	for _, h := range []string{"X-Hop", "Proxy-Authorization", "X-Forwarded-For", "Forwarded", "Via"} {
		assert.NotContains(t, s.header, h)
	}

	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, `{"id":42}`, string(body))
	assert.Equal(t, []string{"a", "b"}, resp.Header["X-Multi"])
	assert.Equal(t, "s=1", resp.Header.Get("Set-Cookie"))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Empty(t, resp.Header.Get("Keep-Alive"))
	assert.Empty(t, resp.Header.Get("Proxy-Foo"))
	assert.Equal(t, faultnet.Stats{Requests: 1, Passed: 1}, p.Stats())
}

func TestPassLargeBodies(t *testing.T) {
	// Chunked upstream responses and request bodies of several MiB go
	// through byte for byte.
	p := start(t, newEcho(t).srv.URL, faultnet.Config{})
	c := newClient(t, 10*time.Second)
	payload := make([]byte, 4<<20)
	_, _ = rand.Read(payload)

	req, err := http.NewRequest(http.MethodPost, p.URL()+"/blob", io.NopCloser(bytes.NewReader(payload)))
	require.NoError(t, err) // io.NopCloser hides the length: the request is chunked
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, bytes.Equal(payload, got), "echoed body differs: got %d bytes, want %d", len(got), len(payload))
}

func TestKeepAlive(t *testing.T) {
	var upstreamConns atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			upstreamConns.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	p := start(t, up.URL, faultnet.Config{})
	c := newClient(t, 10*time.Second)

	for i := range 5 {
		var reused bool
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}
		req, err := http.NewRequest(http.MethodGet, p.URL()+"/", nil)
		require.NoError(t, err)
		resp, err := c.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, i > 0, reused, "request %d: client connection reused = %v", i+1, reused)
	}
	assert.Equal(t, int64(1), upstreamConns.Load(), "upstream connections")
}

func TestDrop(t *testing.T) {
	up := newEcho(t)
	p := start(t, up.srv.URL, faultnet.Config{Decide: always(faultnet.Drop)})

	status, _, err := post(newClient(t, 10*time.Second), p.URL()+"/orders", "order 1")
	require.Error(t, err, "got status %d, want no response", status)
	assert.ErrorIs(t, err, io.EOF)
	// No polling: the proxy read the whole response, written after the
	// handler counted, before it closed the connection.
	assert.Equal(t, int64(1), up.ran.Load(), "upstream executions")
	assert.Equal(t, faultnet.Stats{Requests: 1, Dropped: 1}, p.Stats())
}

func TestReset(t *testing.T) {
	up := newEcho(t)
	p := start(t, up.srv.URL, faultnet.Config{Decide: always(faultnet.Reset)})

	status, _, err := post(newClient(t, 10*time.Second), p.URL()+"/orders", "order 1")
	require.Error(t, err, "got status %d, want no response", status)
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Equal(t, int64(0), up.ran.Load(), "upstream executions")
	assert.Equal(t, faultnet.Stats{Requests: 1, Reset: 1}, p.Stats())
}

func TestDelay(t *testing.T) {
	t.Run("client gives up", func(t *testing.T) {
		up := newEcho(t)
		p := start(t, up.srv.URL, faultnet.Config{Decide: always(faultnet.Delay), Delay: time.Minute})

		_, _, err := post(newClient(t, 50*time.Millisecond), p.URL()+"/orders", "order 1")
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		assert.True(t, ne.Timeout(), "error %v is not a timeout", err)
		assert.Equal(t, int64(1), up.ran.Load(), "upstream executions")
		assert.Equal(t, faultnet.Stats{Requests: 1, Delayed: 1}, p.Stats())
	})

	t.Run("response arrives late", func(t *testing.T) {
		p := start(t, newEcho(t).srv.URL, faultnet.Config{Decide: always(faultnet.Delay), Delay: 100 * time.Millisecond})

		began := time.Now()
		status, body, err := post(newClient(t, 10*time.Second), p.URL()+"/orders", "order 1")
		require.NoError(t, err)
		assert.GreaterOrEqual(t, time.Since(began), 100*time.Millisecond)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, "order 1", body)
	})

	t.Run("close abandons a held response", func(t *testing.T) {
		// The upstream connection turns idle once the response is written:
		// from then on the proxy is reading it or, almost at once, holding it.
		written := make(chan struct{}, 1)
		up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "late")
		}))
		up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateIdle {
				written <- struct{}{}
			}
		}
		up.Start()
		t.Cleanup(up.Close)
		p, err := faultnet.Start(up.URL, faultnet.Config{Decide: always(faultnet.Delay), Delay: time.Hour})
		require.NoError(t, err)

		result := make(chan error, 1)
		c := newClient(t, 0)
		go func() {
			_, _, err := post(c, p.URL()+"/orders", "order 1")
			result <- err
		}()
		waitFor(t, written, patient, "upstream response")

		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		assert.NoError(t, waitFor(t, closed, prompt, "return from Close with a response held"))
		assert.Error(t, waitFor(t, result, patient, "answer to the client"), "the client got the held response")
	})
}

func TestUpstreamUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	t.Run("pass answers 502", func(t *testing.T) {
		p := start(t, "http://"+addr, faultnet.Config{})
		status, body, err := post(newClient(t, 10*time.Second), p.URL()+"/orders", "order 1")
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadGateway, status)
		assert.Contains(t, body, "faultnet: ")
		assert.Equal(t, faultnet.Stats{Requests: 1, Passed: 1, UpstreamErrors: 1}, p.Stats())
	})

	t.Run("drop still drops", func(t *testing.T) {
		p := start(t, "http://"+addr, faultnet.Config{Decide: always(faultnet.Drop)})
		_, _, err := post(newClient(t, 10*time.Second), p.URL()+"/orders", "order 1")
		assert.Error(t, err)
		assert.Equal(t, faultnet.Stats{Requests: 1, Dropped: 1, UpstreamErrors: 1}, p.Stats())
	})
}

func TestDecide(t *testing.T) {
	var (
		mu   sync.Mutex
		ns   []int64
		keys []string
	)
	p := start(t, newEcho(t).srv.URL, faultnet.Config{
		Decide: func(n int64, r *http.Request) faultnet.Fault {
			mu.Lock()
			defer mu.Unlock()
			ns = append(ns, n)
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			return faultnet.Fault(42) // unknown: treated as Pass
		},
	})
	c := newClient(t, 10*time.Second)
	for i := range 3 {
		req, err := http.NewRequest(http.MethodPost, p.URL()+"/orders", strings.NewReader("x"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", fmt.Sprint("k", i))
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.Equal(t, []int64{1, 2, 3}, ns)
	assert.Equal(t, []string{"k0", "k1", "k2"}, keys)
	assert.Equal(t, faultnet.Stats{Requests: 3, Passed: 3}, p.Stats())
}

// faultSequence sends n requests one after another through a proxy with the
// given seed and returns the fault each one met, read from the change in
// Stats, after checking that the client saw what that fault promises.
func faultSequence(t *testing.T, seed uint64, n int) []faultnet.Fault {
	t.Helper()
	p := start(t, newEcho(t).srv.URL, faultnet.Config{
		DropRate: 0.2, ResetRate: 0.1, DelayRate: 0.2, Delay: time.Millisecond, Seed: seed,
	})
	c := newClient(t, 10*time.Second)
	faults := make([]faultnet.Fault, 0, n)
	before := p.Stats()
	for i := range n {
		status, _, err := post(c, p.URL()+"/", "x")
		after := p.Stats()
		var f faultnet.Fault
		switch {
		case after.Dropped > before.Dropped:
			f = faultnet.Drop
		case after.Reset > before.Reset:
			f = faultnet.Reset
		case after.Delayed > before.Delayed:
			f = faultnet.Delay
		}
		require.Equal(t, before.Requests+1, after.Requests, "request %d: Requests", i+1)
		if f == faultnet.Drop || f == faultnet.Reset {
			require.Error(t, err, "request %d (%v): got status %d", i+1, f, status)
		} else {
			require.NoError(t, err, "request %d (%v)", i+1, f)
		}
		faults = append(faults, f)
		before = after
	}
	return faults
}

func TestRatesReproducible(t *testing.T) {
	const n = 200
	first := faultSequence(t, 42, n)
	assert.Equal(t, first, faultSequence(t, 42, n), "same seed, different faults")
	assert.NotEqual(t, first, faultSequence(t, 43, n), "different seeds, same faults")

	count := map[faultnet.Fault]int{}
	for _, f := range first {
		count[f]++
	}
	// Expected 100, 40, 20, 40, with a standard deviation of at most 7.
	for f, want := range map[faultnet.Fault]int{faultnet.Pass: 100, faultnet.Drop: 40, faultnet.Reset: 20, faultnet.Delay: 40} {
		assert.InDelta(t, want, count[f], 21, "%v: %d of %d requests", f, count[f], n)
	}
}

func TestConcurrent(t *testing.T) {
	const goroutines, each = 50, 20
	up := newEcho(t)
	p := start(t, up.srv.URL, faultnet.Config{
		DropRate: 0.1, ResetRate: 0.1, DelayRate: 0.1, Delay: 5 * time.Millisecond, Seed: 7,
	})
	c := newClient(t, 10*time.Second)

	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				want := fmt.Sprintf("goroutine %d request %d", g, i)
				status, body, err := post(c, p.URL()+"/orders", want)
				if err != nil {
					failed.Add(1)
					continue
				}
				ok.Add(1)
				assert.Equal(t, http.StatusOK, status)
				assert.Equal(t, want, body)
				s := p.Stats() // while other requests change it
				assert.Equal(t, s.Requests, s.Passed+s.Dropped+s.Reset+s.Delayed, "%+v", s)
			}
		})
	}
	wg.Wait()

	s := p.Stats()
	assert.Equal(t, int64(goroutines*each), s.Requests)
	assert.Equal(t, s.Passed+s.Delayed, ok.Load(), "responses")
	assert.Equal(t, s.Dropped+s.Reset, failed.Load(), "errors")
	assert.Equal(t, s.Passed+s.Delayed+s.Dropped, up.ran.Load(), "upstream executions")
	assert.Zero(t, s.UpstreamErrors)
	for _, n := range []int64{s.Passed, s.Dropped, s.Reset, s.Delayed} {
		assert.Positive(t, n, "%+v", s)
	}
}

func TestClose(t *testing.T) {
	t.Run("idempotent and concurrent", func(t *testing.T) {
		p, err := faultnet.Start(newEcho(t).srv.URL, faultnet.Config{})
		require.NoError(t, err)
		c := newClient(t, 10*time.Second)
		_, _, err = post(c, p.URL()+"/", "x") // leave a keep-alive connection open
		require.NoError(t, err)

		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- p.Close() }()
		}
		for range 3 {
			assert.NoError(t, waitFor(t, errs, prompt, "return from Close"))
		}
		assert.NoError(t, p.Close())
		_, _, err = post(c, p.URL()+"/", "x")
		assert.Error(t, err, "request after Close")
	})

	t.Run("does not wait for a hanging upstream", func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the proxy leaving
			close(entered)
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		t.Cleanup(up.Close)
		t.Cleanup(func() { close(release) })
		p, err := faultnet.Start(up.URL, faultnet.Config{})
		require.NoError(t, err)

		result := make(chan error, 1)
		c := newClient(t, 0)
		go func() {
			_, _, err := post(c, p.URL()+"/", "x")
			result <- err
		}()
		waitFor(t, entered, patient, "upstream request")

		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		assert.NoError(t, waitFor(t, closed, prompt, "return from Close with an upstream request in flight"))
		waitFor(t, result, patient, "answer to the client") // an error or a 502, either way an answer
	})
}

func TestBlackhole(t *testing.T) {
	t.Run("holds requests until it ends", func(t *testing.T) {
		up := newEcho(t)
		p := start(t, up.srv.URL, faultnet.Config{})
		p.SetBlackhole(true)
		p.SetBlackhole(true) // no change

		_, _, err := post(newClient(t, 200*time.Millisecond), p.URL()+"/orders", "held")
		require.Error(t, err, "an answer came through the black hole")
		assert.Zero(t, up.ran.Load(), "a request went through the black hole")

		result := make(chan string, 1)
		c := newClient(t, patient)
		go func() {
			_, body, err := post(c, p.URL()+"/orders", "waits")
			if err != nil {
				body = err.Error()
			}
			result <- body
		}()
		// The second request is held as soon as the proxy has seen it.
		deadline := time.Now().Add(patient)
		for p.Stats().Blackholed < 2 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		require.Equal(t, int64(2), p.Stats().Blackholed)
		p.SetBlackhole(false)
		assert.Equal(t, "waits", waitFor(t, result, patient, "answer after the black hole"))
		status, body, err := post(c, p.URL()+"/orders", "after")
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, "after", body)
		s := p.Stats()
		assert.Equal(t, int64(3), s.Requests, "%+v", s)
		assert.Equal(t, int64(2), s.Blackholed, "%+v", s)
	})

	t.Run("holds responses until it ends", func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			_, _ = io.WriteString(w, "late")
		}))
		t.Cleanup(up.Close)
		p := start(t, up.URL, faultnet.Config{})
		result := make(chan string, 1)
		c := newClient(t, patient)
		go func() {
			_, body, err := post(c, p.URL()+"/orders", "x")
			if err != nil {
				body = err.Error()
			}
			result <- body
		}()
		waitFor(t, entered, patient, "upstream request")
		p.SetBlackhole(true)
		close(release)
		select {
		case body := <-result:
			t.Fatalf("an answer came through the black hole: %q", body)
		case <-time.After(200 * time.Millisecond):
		}
		p.SetBlackhole(false)
		assert.Equal(t, "late", waitFor(t, result, patient, "answer after the black hole"))
		assert.Equal(t, int64(1), p.Stats().Blackholed)
	})

	t.Run("close ends the hold", func(t *testing.T) {
		up := newEcho(t)
		p, err := faultnet.Start(up.srv.URL, faultnet.Config{})
		require.NoError(t, err)
		p.SetBlackhole(true)
		result := make(chan error, 1)
		c := newClient(t, 0)
		go func() {
			_, _, err := post(c, p.URL()+"/orders", "x")
			result <- err
		}()
		deadline := time.Now().Add(patient)
		for p.Stats().Blackholed < 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		assert.NoError(t, waitFor(t, closed, prompt, "return from Close with a request held"))
		assert.Error(t, waitFor(t, result, patient, "answer to the client"))
		assert.Zero(t, up.ran.Load(), "Close forwarded a held request")
	})
}

// TestBlackholeToggled turns a black hole on and off while requests flow:
// every request is answered or fails, none hangs, and the counts add up.
func TestBlackholeToggled(t *testing.T) {
	up := newEcho(t)
	p := start(t, up.srv.URL, faultnet.Config{})
	c := newClient(t, patient)
	stop := make(chan struct{})
	toggled := make(chan struct{})
	go func() {
		defer close(toggled)
		for on := true; ; on = !on {
			p.SetBlackhole(on)
			select {
			case <-stop:
				p.SetBlackhole(false)
				return
			case <-time.After(3 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	var answered atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				body := fmt.Sprintf("%d-%d", g, i)
				if status, got, err := post(c, p.URL()+"/", body); err == nil && status == http.StatusOK && got == body {
					answered.Add(1)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	waitFor(t, done, 2*patient, "every request to end")
	close(stop)
	<-toggled
	s := p.Stats()
	assert.Equal(t, int64(160), s.Requests, "%+v", s)
	assert.Equal(t, int64(160), answered.Load(), "requests answered with their own body")
	assert.Positive(t, s.Blackholed, "%+v", s)
	assert.Equal(t, int64(160), up.ran.Load())
}
