package step_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/webhook"
)

// serve starts h behind server's middleware on store, both closed when t
// ends.
func serve(t *testing.T, store engine.Store, cfg engine.Config, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	mw, err := server.New(store, server.WithConfig(quiet(cfg)))
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(h))
	t.Cleanup(func() {
		srv.Close()
		require.NoError(t, mw.Shutdown(context.Background()))
	})
	return srv
}

type reply struct {
	status int
	body   string
}

// post sends an order with key to srv.
func post(ctx context.Context, t *testing.T, srv *httptest.Server, key string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A1"}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(b)}, err
}

// postUntil posts until the answer is not the 409 of a request in flight.
func postUntil(t *testing.T, srv *httptest.Server, key string) reply {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := post(context.Background(), t, srv, key)
		require.NoError(t, err)
		if got.status != http.StatusConflict || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClientGoneMidStep: the client goes away while a step runs (its
// request's context is cancelled); the step's function, which does not
// watch its context, finishes, and its result is recorded all the same: the
// client's retry replays it.
func TestClientGoneMidStep(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		started := make(chan struct{})
		stepErr := make(chan error, 1)
		var runs atomic.Int32
		srv := serve(t, store, engine.Config{}, func(w http.ResponseWriter, r *http.Request) {
			v, err := step.Run(r.Context(), "charge", nil, func(ctx context.Context) (string, error) {
				if runs.Add(1) == 1 {
					close(started)
					<-ctx.Done() // the client went away
				}
				return "ch_1", nil
			})
			select {
			case stepErr <- err: // the first run's
			default:
			}
			if err != nil || r.Context().Err() != nil {
				return // no answer: nobody to give it to
			}
			io.WriteString(w, v)
		})
		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan error, 1)
		go func() {
			_, err := post(ctx, t, srv, "k")
			gone <- err
		}()
		<-started
		cancel()
		assert.ErrorIs(t, <-gone, context.Canceled)
		require.NoError(t, <-stepErr, "recorded, though the client left")
		got := postUntil(t, srv, "k")
		assert.Equal(t, reply{http.StatusOK, "ch_1"}, got)
		assert.Equal(t, int32(1), runs.Load())
	})
}

// TestDetachedFromClient: a handler that finishes its work when its client
// goes away (its steps on a context detached from the request's) runs and
// records every step: the lease is still held, and the retry replays.
func TestDetachedFromClient(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		started := make(chan struct{})
		finished := make(chan error, 1)
		var a, b atomic.Int32
		srv := serve(t, store, engine.Config{}, func(w http.ResponseWriter, r *http.Request) {
			ctx := context.WithoutCancel(r.Context())
			_, err := step.Run(ctx, "a", nil, func(context.Context) (int, error) {
				if a.Add(1) == 1 {
					close(started)
					<-r.Context().Done() // the client went away
				}
				return 1, nil
			})
			if err == nil {
				_, err = step.Run(ctx, "b", nil, func(context.Context) (int, error) { return int(b.Add(1)), nil })
			}
			select {
			case finished <- err: // the first run's
			default:
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			io.WriteString(w, "done")
		})
		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan error, 1)
		go func() {
			_, err := post(ctx, t, srv, "k")
			gone <- err
		}()
		<-started
		cancel()
		assert.ErrorIs(t, <-gone, context.Canceled)
		require.NoError(t, <-finished, "the steps after the client left")
		got := postUntil(t, srv, "k")
		assert.Equal(t, reply{http.StatusOK, "done"}, got)
		assert.Equal(t, [2]int32{1, 1}, [2]int32{a.Load(), b.Load()})
	})
}

// TestTimeoutHandlerInside: http.TimeoutHandler inside the middleware (the
// server package says to put it outside) answers 503, which releases the
// key while its handler's goroutine still runs: a step still running then
// is not recorded, and step.Run tells the handler so (ErrLeaseLost); a step
// begun after the timeout does not run; the retry replays the steps
// recorded before.
func TestTimeoutHandlerInside(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		var a, b, c atomic.Int32
		proceed := make(chan struct{})
		first := make(chan [2]error, 1)
		handlerDone := make(chan struct{}, 2)
		h := func(w http.ResponseWriter, r *http.Request) {
			defer func() { handlerDone <- struct{}{} }()
			ctx := r.Context()
			_, err := step.Run(ctx, "a", nil, func(context.Context) (int, error) { return int(a.Add(1)), nil })
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_, errB := step.Run(ctx, "b", nil, func(ctx context.Context) (int, error) {
				if b.Add(1) == 1 {
					<-ctx.Done() // TimeoutHandler's timeout
					<-proceed
				}
				return 0, nil
			})
			_, errC := step.Run(ctx, "c", nil, func(context.Context) (int, error) { return int(c.Add(1)), nil })
			if b.Load() == 1 {
				first <- [2]error{errB, errC}
				return
			}
			io.WriteString(w, "done")
		}
		mw, err := server.New(store, server.WithConfig(quiet(engine.Config{})))
		require.NoError(t, err)
		srv := httptest.NewServer(mw.Handler(http.TimeoutHandler(http.HandlerFunc(h), 300*time.Millisecond, "timed out")))
		defer func() {
			srv.Close()
			require.NoError(t, mw.Shutdown(context.Background()))
		}()
		got, err := post(context.Background(), t, srv, "k")
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, got.status)
		close(proceed)
		errs := <-first
		<-handlerDone
		assert.ErrorIs(t, errs[0], engine.ErrLeaseLost, "b ran, and was not recorded")
		assert.Error(t, errs[1])
		assert.Equal(t, int32(0), c.Load(), "c did not run")
		got = postUntil(t, srv, "k")
		<-handlerDone
		assert.Equal(t, reply{http.StatusOK, "done"}, got)
		assert.Equal(t, [3]int32{1, 2, 1}, [3]int32{a.Load(), b.Load(), c.Load()}, "a replayed; b, cut by the timeout, ran again")
	})
}

// TestFailOpen: a door that runs its handler unprotected (its store
// failed, and engine.Config.FailOpen) gives it no steps: step.Run returns
// an error wrapping ErrNoSteps, and the step does not run.
func TestFailOpen(t *testing.T) {
	fs := faultstore.New(newMemory(t))
	fs.Set(faultstore.Claim, faultstore.Fault{Err: errDown})
	cfg := engine.Config{FailOpen: true, StoreTimeout: 50 * time.Millisecond}
	handler := func(w http.ResponseWriter, r *http.Request) {
		_, err := step.Run(r.Context(), "charge", nil, func(context.Context) (int, error) {
			t.Error("a step ran unprotected")
			return 0, nil
		})
		if !errors.Is(err, step.ErrNoSteps) {
			t.Errorf("step.Run = %v, want ErrNoSteps", err)
		}
		io.WriteString(w, "unprotected")
	}

	t.Run("server", func(t *testing.T) {
		srv := serve(t, fs, cfg, handler)
		got, err := post(context.Background(), t, srv, "k")
		require.NoError(t, err)
		assert.Equal(t, reply{http.StatusOK, "unprotected"}, got)
	})
	t.Run("webhook", func(t *testing.T) {
		sender := webhook.Sender{
			Name:   "test",
			Verify: func(*http.Request, []byte, time.Time) error { return nil },
			ID:     func(r *http.Request, _ []byte) (string, error) { return r.Header.Get("X-Event-Id"), nil },
		}
		rc, err := webhook.New(fs, sender, webhook.WithConfig(quiet(cfg)))
		require.NoError(t, err)
		defer rc.Shutdown(context.Background())
		req := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader([]byte(`{}`)))
		req.Header.Set("X-Event-Id", "ev_1")
		w := httptest.NewRecorder()
		rc.Handler(http.HandlerFunc(handler)).ServeHTTP(w, req)
		assert.Equal(t, http.StatusOK, w.Code)
		assert.Equal(t, "unprotected", w.Body.String())
	})
}
