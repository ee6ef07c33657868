package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

// TestCanceledBeforeSending: a call whose context has already ended sends
// nothing, however warm the connection pool (net/http may send such a
// request over an idle connection), and says why.
func TestCanceledBeforeSending(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c := clienttest.New(t)
	// A warm connection, idle in the pool.
	resp, err := c.Post(t.Context(), srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	before := hits.Load()

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 200 {
		_, err := c.Post(ctx, srv.URL, "text/plain", strings.NewReader("x"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want one wrapping context.Canceled", err)
		}
		var re *idempotency.RetryError
		if !errors.As(err, &re) || re.Attempts != 0 {
			t.Fatalf("err = %#v, want a *RetryError with no attempt", err)
		}
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d requests reached the server for a caller already gone", n)
	}
}
