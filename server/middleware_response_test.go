package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

func TestLargeResponseRunsOnce(t *testing.T) {
	var calls atomic.Int64
	big := strings.Repeat("z", 64<<10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Location", "/orders/big")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, big)
	})
	srv, _ := fixture(t, h, server.WithMaxStored(1024))
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, first.status)
	assert.Equal(t, big, first.body, "the client gets the whole response")
	// Too large to keep, it went out as it was written, maybe before the
	// exchange was stored.
	var second reply
	waitFor(t, "the exchange to be stored", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, int64(1), calls.Load(), "a response too large to store must not make the request run twice")
	assert.Equal(t, http.StatusCreated, second.status)
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "true", second.header.Get("Idempotent-Body-Omitted"))
	assert.Equal(t, "/orders/big", second.header.Get("Location"))
	assert.Empty(t, second.body)
}

func TestStreamingHandler(t *testing.T) {
	var calls, flushErrors atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "event %d\n", i)
			if http.NewResponseController(w).Flush() != nil {
				flushErrors.Add(1)
			}
		}
	})
	srv, _ := fixture(t, h)
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, "event 0\nevent 1\nevent 2\n", first.body)
	assert.Zero(t, flushErrors.Load(), "flush errors")
	// The client may have the whole stream before the exchange is stored.
	var second reply
	waitFor(t, "the streamed exchange to be stored", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, http.StatusOK, second.status)
	assert.Equal(t, "true", second.header.Get("Idempotent-Body-Omitted"))
	assert.Equal(t, "text/event-stream", second.header.Get("Content-Type"))
	assert.Equal(t, int64(1), calls.Load())
}

// TestClientGoneStillStored: the client disconnects while the handler runs;
// the response is stored anyway, so the retry gets the replay.
func TestClientGoneStillStored(t *testing.T) {
	h := newBlocking()
	gone := make(chan struct{})
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.started <- struct{}{}
		<-r.Context().Done() // the client has gone
		close(gone)
		h.orders.ServeHTTP(w, r)
	})
	srv, _ := fixture(t, inner)
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
	<-h.started
	cancel()
	assert.Error(t, <-errc)
	<-gone
	// The handler finishes after the disconnect; poll until its response
	// is stored.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := post(t, srv.URL, "k", "x")
		if got.status == http.StatusCreated {
			assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
			break
		}
		require.Equal(t, http.StatusConflict, got.status)
		require.True(t, time.Now().Before(deadline), "the response was never stored")
	}
	assert.Equal(t, int64(1), h.executions.Load())
}

func TestNoContentReplay(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv, _ := fixture(t, h)
	post(t, srv.URL, "k", "x")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusNoContent, got.status)
	assert.Equal(t, "true", got.header.Get("Idempotent-Replayed"))
	assert.Empty(t, got.body)
}

func TestHijackingHandler(t *testing.T) {
	var calls atomic.Int64
	var logs bytes.Buffer
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		rw.Flush()
	})
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Logger: logger}))
	first := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusAccepted, first.status)
	assert.Equal(t, "ok", first.body)
	// The client has its answer as soon as the handler wrote it on the
	// hijacked connection, maybe before the exchange is stored.
	var second reply
	waitFor(t, "the hijacked exchange to be stored", func() bool {
		second = post(t, srv.URL, "k", "x")
		return second.status != http.StatusConflict
	})
	assert.Equal(t, int64(1), calls.Load(), "a hijacked exchange still runs once")
	assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "true", second.header.Get("Idempotent-Body-Omitted"))
	// The line is logged as the exchange is stored, which may be after
	// the replay above was answered: wait for it.
	waitFor(t, "the hijacked exchange to be logged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "how=hijacked")
	})
}
