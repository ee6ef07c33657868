package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestInFlight(t *testing.T) {
	h := newBlocking()
	srv, _ := fixture(t, h, server.WithConfig(engine.Config{Lease: time.Minute}))
	first := postAsync(srv.URL, "k", "x")
	<-h.started
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusConflict, got.status)
	assertProblem(t, got, "ErrInFlight")
	ra, err := strconv.Atoi(got.header.Get("Retry-After"))
	assert.NoError(t, err)
	assert.True(t, ra >= 1 && ra <= 60, "Retry-After = %d, want 1..60", ra)
	assert.Equal(t, http.StatusUnprocessableEntity, post(t, srv.URL, "k", "other").status)
	close(h.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, int64(1), h.executions.Load())
}

func TestConcurrentIdentical(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			h := newBlocking()
			opts := []server.Option{}
			if wait {
				opts = append(opts, server.WithConfig(engine.Config{Wait: 30 * time.Second}))
			}
			srv, _ := fixture(t, h, opts...)
			const n = 200
			tr := &http.Transport{MaxIdleConnsPerHost: n}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			replies := make(chan reply, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("same"))
					req.Header.Set("Idempotency-Key", "one")
					resp, err := client.Do(req)
					if err != nil {
						replies <- reply{status: -1, body: err.Error()}
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					replies <- reply{resp.StatusCode, resp.Header, string(b)}
				})
			}
			<-h.started
			if !wait {
				// Let the original finish only once every duplicate
				// has been refused.
				for range n - 1 {
					r := <-replies
					assert.Equal(t, http.StatusConflict, r.status, r.body)
				}
				close(h.release)
				wg.Wait()
				assert.Equal(t, http.StatusCreated, (<-replies).status)
			} else {
				close(h.release)
				wg.Wait()
				close(replies)
				var first string
				for r := range replies {
					assert.Equal(t, http.StatusCreated, r.status, r.body)
					if first == "" {
						first = r.body
					}
					assert.Equal(t, first, r.body, "every waiter gets the original's response")
				}
			}
			assert.Equal(t, int64(1), h.executions.Load(), "executions")
		})
	}
}

func TestFailuresReleaseTheKey(t *testing.T) {
	var calls atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusInternalServerError)
		case 2:
			w.WriteHeader(http.StatusTooManyRequests)
		case 3:
			panic("boom")
		default:
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "made")
		}
	})
	var logs bytes.Buffer
	var mu sync.Mutex
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(mw.Handler(h))
	srv.Config.ErrorLog = log.New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), "", 0)
	srv.Start()
	defer srv.Close()

	assert.Equal(t, http.StatusInternalServerError, post(t, srv.URL, "k", "x").status)
	assert.Equal(t, http.StatusTooManyRequests, post(t, srv.URL, "k", "x").status)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k")
	// A fresh connection: net/http itself retries a keyed request that
	// fails on a reused one.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, err = fresh.Do(req)
	assert.Error(t, err, "a panicking handler's connection is dropped by the server")
	got := post(t, srv.URL, "k", "x")
	assert.Equal(t, http.StatusCreated, got.status)
	assert.Equal(t, "made", got.body)
	again := post(t, srv.URL, "k", "x")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, int64(4), calls.Load())
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, logs.String(), "panic serving", "the panic reaches the server's recovery")
	assert.Contains(t, logs.String(), "boom")
}

// blind is a store that cannot see the fingerprint of a request in flight.
type blind struct{ memstore.Store }

func (s blind) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if c.Status == engine.InFlight {
		c.Fingerprint = ""
	}
	return c, err
}

func TestInFlightUnknownFingerprint(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	defer store.Close()
	h := newBlocking()
	srv := fixtureWith(t, blind{store}, h)
	first := postAsync(srv.URL, "k", "x")
	<-h.started
	assert.Equal(t, http.StatusConflict, post(t, srv.URL, "k", "other body").status,
		"with the original's fingerprint unknown, a duplicate is in flight, not a mismatch")
	close(h.release)
	assert.Equal(t, http.StatusCreated, (<-first).status)
	assert.Equal(t, http.StatusUnprocessableEntity, post(t, srv.URL, "k", "other body").status)
}
