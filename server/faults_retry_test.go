package server_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
)

// TestInFlightRetryAfter: a 409's Retry-After is a short hint, not the
// lease's remaining minute, and never longer than the lease has left.
func TestInFlightRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []server.Option
		want int
	}{
		{"default", nil, 1},
		{"configured", []server.Option{server.WithConfig(engine.Config{RetryAfter: 3 * time.Second})}, 3},
		{"capped by the lease", []server.Option{server.WithConfig(engine.Config{RetryAfter: time.Minute, Lease: 2 * time.Second})}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newBlocking()
			srv, _ := fixture(t, h, tc.opts...)
			first := postAsync(srv.URL, "k", "x")
			<-h.started
			got := post(t, srv.URL, "k", "x")
			assert.Equal(t, http.StatusConflict, got.status)
			assert.Equal(t, strconv.Itoa(tc.want), got.header.Get("Retry-After"))
			close(h.release)
			<-first
		})
	}
}

// TestRetryStatusesReleasedWhateverTheirShape: a status that releases the key
// releases it even when the response was too large to store or was flushed.
func TestRetryStatusesReleasedWhateverTheirShape(t *testing.T) {
	big := strings.Repeat("e", 4096)
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
	}{
		{"large", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, big)
		}},
		{"flushed", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "slow down")
			http.NewResponseController(w).Flush()
		}},
		{"flushed before the status", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			http.NewResponseController(w).Flush()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					tc.write(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			srv, _ := fixture(t, h, server.WithMaxStored(1024))
			first := post(t, srv.URL, "k", "x")
			// Streamed, the answer may arrive before the key is released
			// (or the exchange stored).
			var second reply
			waitFor(t, "the key to be released or stored", func() bool {
				second = post(t, srv.URL, "k", "x")
				return second.status != http.StatusConflict
			})
			if first.status == http.StatusOK {
				// A flush before any status is a 200, which is stored.
				assert.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
				assert.Equal(t, int64(1), calls.Load())
				return
			}
			assert.Equal(t, http.StatusCreated, second.status, "the retry runs again")
			assert.Empty(t, second.header.Get("Idempotent-Replayed"))
			assert.Equal(t, int64(2), calls.Load())
		})
	}
}
