package e2e_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/server"
)

// TestCompleteAfterOutage is the store outage that TestFaultRun meets by
// chance, made to happen every time: the store goes away while the handler
// runs, so that the response cannot be stored within the store timeout; the
// response, which the middleware sends anyway, is lost on the network; the
// store comes back. The client, retrying with its key, must then be
// answered with the order that was made, and the order must not be made
// again: the promise is that a retried operation takes effect once, and
// the process that ran it never stopped.
func TestCompleteAfterOutage(t *testing.T) {
	for _, kind := range linkedStores() {
		t.Run(kind.name, func(t *testing.T) {
			s := kind.new(t)
			var (
				executions atomic.Int64
				once       sync.Once
			)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := executions.Add(1)
				once.Do(s.link.Cut) // the store goes away while the order is made
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "order "+string(rune('0'+n)))
			})
			mw, err := server.New(s.store, server.WithConfig(engine.Config{StoreTimeout: 300 * time.Millisecond, Lease: time.Second}))
			require.NoError(t, err)
			srv := startServer(t, mw.Handler(h))
			proxy := startProxy(t, srv.URL, faultnet.Config{Decide: func(n int64, _ *http.Request) faultnet.Fault {
				if n == 1 {
					return faultnet.Drop // the response to the first request is lost
				}
				return faultnet.Pass
			}})
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			send := func() (*http.Response, error) {
				req, _ := http.NewRequest(http.MethodPost, proxy.URL()+"/orders", strings.NewReader(`{"sku":"A1"}`))
				req.Header.Set("Idempotency-Key", "outage-key")
				return client.Do(req)
			}

			_, err = send()
			require.Error(t, err, "the first response was not lost")
			require.Equal(t, int64(1), executions.Load())
			s.link.Heal()

			// The caller retries, as it must: it cannot tell what
			// happened. In flight (409) or unavailable (503) may be
			// answered for a while, but not for ever.
			deadline := time.Now().Add(15 * time.Second)
			var status int
			var body, replayed string
			for time.Now().Before(deadline) {
				resp, err := send()
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				status, body, replayed = resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed")
				if status != http.StatusConflict && status != http.StatusServiceUnavailable {
					break
				}
				time.Sleep(50 * time.Millisecond) // the client's own pause between retries
			}
			assert.Equal(t, int64(1), executions.Load(), "executions of the one order")
			assert.Equal(t, http.StatusCreated, status)
			assert.Equal(t, "true", replayed, "the retry's answer is a replay")
			assert.Equal(t, "order 1", body)
		})
	}
}

// TestReleaseAfterOutage: the handler answers 5xx while the store is away,
// for longer than the store timeout, so the release that gives the key back
// cannot be written in time; then the store comes back. The middleware knew
// that nothing was done, and told the client to retry: the retry must run
// the request, under RefuseAbandoned too, and must not be told of an
// abandoned holder. A release that was never written would leave the key in
// flight until its lease ended, and the retry that took it over then would
// be answered "outcome unknown".
func TestReleaseAfterOutage(t *testing.T) {
	for _, kind := range linkedStores() {
		t.Run(kind.name, func(t *testing.T) {
			s := kind.new(t)
			var (
				executions atomic.Int64
				abandoned  atomic.Int64
			)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if executions.Add(1) == 1 {
					s.link.Cut() // the store goes away, and the order cannot be made
					http.Error(w, "try again", http.StatusServiceUnavailable)
					return
				}
				lease, _ := engine.LeaseFromContext(r.Context())
				abandoned.Store(int64(lease.Abandoned))
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "order 2")
			})
			mw, err := server.New(s.store, server.WithConfig(engine.Config{StoreTimeout: 300 * time.Millisecond, Lease: 2 * time.Second, Abandoned: engine.RefuseAbandoned}))
			require.NoError(t, err)
			t.Cleanup(func() { // after the server's Close
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				assert.NoError(t, mw.Shutdown(ctx))
			})
			srv := startServer(t, mw.Handler(h))
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			send := func() (status int, outcome, body string) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A1"}`))
				req.Header.Set("Idempotency-Key", "release-outage-key")
				resp, err := client.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, resp.Header.Get(engine.HeaderOutcome), string(b)
			}

			status, _, _ := send()
			require.Equal(t, http.StatusServiceUnavailable, status, "the handler's answer")
			s.link.Heal()

			deadline := time.Now().Add(15 * time.Second)
			var outcome, body string
			for time.Now().Before(deadline) {
				status, outcome, body = send()
				if outcome != "" || status != http.StatusConflict && status != http.StatusServiceUnavailable {
					break
				}
				time.Sleep(50 * time.Millisecond) // the client's own pause between retries
			}
			assert.Empty(t, outcome, "the retry is answered \"outcome unknown\": %s", body)
			assert.Equal(t, http.StatusCreated, status, body)
			assert.Equal(t, int64(2), executions.Load(), "executions")
			assert.Zero(t, abandoned.Load(), "Abandoned of the retry's run")
		})
	}
}
