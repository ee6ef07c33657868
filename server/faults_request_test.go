package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// failingBody is a request body that breaks after a few bytes.
type failingBody struct{ n int }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errors.New("decoder broke")
	}
	n := min(len(p), b.n)
	for i := range n {
		p[i] = 'b'
	}
	b.n -= n
	return n, nil
}

func (*failingBody) Close() error { return nil }

// TestBodyReadFails: a body that cannot be read is answered 413 or 400, with
// nothing claimed and the handler not run.
func TestBodyReadFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outer  func(http.Handler) http.Handler
		want   int
		anchor string
	}{
		{"outer MaxBytesReader", func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = http.MaxBytesReader(w, r.Body, 4)
				next.ServeHTTP(w, r)
			})
		}, http.StatusRequestEntityTooLarge, "ErrBodyTooLarge"},
		{"broken decoder", func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = &failingBody{n: 3}
				next.ServeHTTP(w, r)
			})
		}, http.StatusBadRequest, "ErrBodyUnreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &orders{}
			mem, err := memstore.New()
			require.NoError(t, err)
			defer mem.Close()
			mw, err := server.New(mem)
			require.NoError(t, err)
			srv := startServer(t, tc.outer(mw.Handler(h)))
			got := post(t, srv.URL, "k", "a body of some length")
			assert.Equal(t, tc.want, got.status)
			assertProblem(t, got, tc.anchor)
			assert.Zero(t, h.executions.Load())
			assert.Zero(t, mem.Len(), "nothing claimed")
		})
	}
	t.Run("shorter than its Content-Length", func(t *testing.T) {
		h := &orders{}
		srv, mem := fixture(t, h)
		status, err := rawPostShort(srv.Listener.Addr().String(), "Idempotency-Key: k\r\n", 100, "only ten b")
		if err == nil {
			assert.Equal(t, http.StatusBadRequest, status)
		}
		waitFor(t, "the server to give up on the body", func() bool { return mem.Len() == 0 })
		assert.Zero(t, h.executions.Load())
	})
}

// TestEncodedPathsAreDifferentRequests: /items/a%2Fb and /items/a/b name
// different resources, so a key used for one is refused for the other.
func TestEncodedPathsAreDifferentRequests(t *testing.T) {
	h := &orders{}
	srv, _ := fixture(t, h)
	assert.Equal(t, http.StatusCreated, post(t, srv.URL+"/items/a%2Fb", "k", "x").status)
	got := post(t, srv.URL+"/items/a/b", "k", "x")
	assert.Equal(t, http.StatusUnprocessableEntity, got.status)
	assert.Equal(t, int64(1), h.executions.Load())
}

// TestHandlerGivesUpWhenClientLeaves: a handler that returns without writing
// because its client went away is not stored as an empty 200; the retry runs.
func TestHandlerGivesUpWhenClientLeaves(t *testing.T) {
	var calls atomic.Int64
	started := make(chan struct{}, 1)
	gaveUp := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			started <- struct{}{}
			<-r.Context().Done()
			close(gaveUp)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	})
	srv, mem := fixture(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	assert.Error(t, <-errc)
	<-gaveUp
	waitFor(t, "the claim to be released", func() bool { return mem.Len() == 0 })
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "made", got.body)
	assert.Empty(t, got.header.Get("Idempotent-Replayed"))
}

// rawPostShort sends a request whose body is shorter than the Content-Length
// it declares, then closes its side of the connection, and reads the answer
// if one comes.
func rawPostShort(addr, headers string, declared int, body string) (int, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s", declared, headers, body)
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestClientLeavesDuringClaim: the client goes away while a slow Claim is
// out. The Claim is seen through (its context ignores the disconnect), and
// the key it acquired is given back: nothing ran, and a retry runs at once
// instead of meeting a key in flight.
func TestClientLeavesDuringClaim(t *testing.T) {
	store, mem := faulty(t)
	store.Set(faultstore.Claim, faultstore.Fault{Delay: 200 * time.Millisecond, Times: 1})
	h := &orders{}
	srv := fixtureWith(t, store, h)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	_, err := http.DefaultClient.Do(req)
	require.Error(t, err, "the client gave up")
	waitFor(t, "the claim to be made and given back", func() bool {
		return store.Calls(faultstore.Release) == 1 && mem.Len() == 0
	})
	assert.Zero(t, h.executions.Load(), "nothing ran for a client that had gone")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, int64(1), h.executions.Load())
}
