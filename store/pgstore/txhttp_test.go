package pgstore_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/pgstore"
)

// These tests run transactional mode behind the middleware, over loopback
// HTTP.

// post sends a keyed POST to url and returns its status, or 0 and the error.
func post(ctx context.Context, c *http.Client, url, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer tenant-1")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

type postResult struct {
	status int
	err    error
}

func postAsync(ctx context.Context, c *http.Client, url, key string) <-chan postResult {
	ch := make(chan postResult, 1)
	go func() {
		status, err := post(ctx, c, url, key)
		ch <- postResult{status, err}
	}()
	return ch
}

// A lease shorter than the lock timeout: the Claim's own deadline (the
// lease less its tenth) would end the wait for the original's transaction
// before the lock timeout does, as a store failure (503). A duplicate that
// arrives while the original runs is told 409, as documented.
func TestTxDuplicateWithShortLease(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, _ := newStore(t, pool, pgstore.WithTransactions()) // defaultLockTimeout
	const lease = 2 * time.Second
	require.Less(t, lease, pgstore.DefaultLockTimeout+pgstore.DefaultLockTimeout/9,
		"the lease must make the Claim's timeout shorter than the lock timeout")
	mw, err := server.New(s, server.WithConfig(engine.Config{Lease: lease}))
	require.NoError(t, err)
	var (
		once     sync.Once
		started  = make(chan struct{})
		finish   = make(chan struct{})
		finished sync.Once
	)
	release := func() { finished.Do(func() { close(finish) }) }
	defer release()
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		select {
		case <-finish:
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	first := postAsync(ctx, srv.Client(), srv.URL, "short-lease")
	select {
	case <-started:
	case r := <-first:
		t.Fatalf("first request answered %d, %v before its handler ran", r.status, r.err)
	}
	start := time.Now()
	status, err := post(ctx, srv.Client(), srv.URL, "short-lease")
	require.NoError(t, err)
	assert.Equal(t, http.StatusConflict, status, "duplicate's status (after %v)", time.Since(start))
	release()
	r := <-first
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusCreated, r.status, "first request's status")
}

// A handler that waits on another service, its transaction idle, past the
// idle timeout: PostgreSQL ends the transaction, and with it the row lock
// that kept retries out. The retry runs; the handler must learn that its
// transaction is gone, through its context, before it does its effect
// outside the database, or the effect is done twice.
func TestTxHandlerToldWhenServerEndsTransaction(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	orders := newOrders(t, pool)
	s, _ := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithIdleTimeout(time.Second))
	mw, err := server.New(s) // the default lease: a minute, renewed every 20 s
	require.NoError(t, err)
	var (
		attempts  atomic.Int32
		effects   atomic.Int32 // the other service's
		waiting   = make(chan uint32, 1)
		cancelled = make(chan error, 1)
		proceed   = make(chan struct{})
		once      sync.Once
	)
	letFirstProceed := func() { once.Do(func() { close(proceed) }) }
	defer letFirstProceed()
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if err := placeOrder(ctx, orders, "order-1", 100); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if attempts.Add(1) == 1 {
			// The first attempt waits on the other service (until the
			// test lets it go, or its context ends).
			tx, _ := pgstore.TxFromContext(ctx)
			waiting <- tx.Conn().PgConn().PID()
			idle := time.Now()
			select {
			case <-ctx.Done():
				t.Logf("the first handler's context was cancelled %v after its transaction went idle", time.Since(idle))
				cancelled <- context.Cause(ctx)
				return
			case <-proceed:
			}
		}
		effects.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	first := postAsync(ctx, srv.Client(), srv.URL, "order-1")
	var pid uint32
	select {
	case pid = <-waiting:
	case r := <-first:
		t.Fatalf("first request answered %d, %v before its handler waited", r.status, r.err)
	}
	waitForBackendGone(t, ctx, pool, pid)
	// The retry comes: the key is free again, and it runs.
	status, err := post(ctx, srv.Client(), srv.URL, "order-1")
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, status, "retry's status")

	select {
	case cause := <-cancelled:
		assert.ErrorIs(t, cause, engine.ErrLeaseLost, "the first handler's context's cause")
	case <-time.After(10 * time.Second):
		t.Errorf("the first handler's context is not done 10 s after its transaction ended")
		letFirstProceed()
	}
	r := <-first
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "first request's status")
	assert.Equal(t, int32(1), effects.Load(), "effects on the other service")
	assert.Equal(t, 1, countOrders(t, ctx, pool, orders, "order-1"), "orders")
}
