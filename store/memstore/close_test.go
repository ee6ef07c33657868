package memstore_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestCloseEndsEveryCall: after Close every method fails at once with
// ErrClosed, a holder's calls with ErrLeaseLost too, and no record is kept.
func TestCloseEndsEveryCall(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	id := engine.ID{Key: "held"}
	c, err := s.Claim(ctx, id, "fp", time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	done := engine.ID{Key: "done"}
	d, err := s.Claim(ctx, done, "fp", time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, d.Token, &engine.Response{Status: http.StatusCreated}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Errorf("after Close Len() = %d, Bytes() = %d; want 0, 0", s.Len(), s.Bytes())
	}
	for _, tc := range []struct {
		op        string
		err       error
		leaseLost bool
	}{
		{"Complete", s.Complete(ctx, id, c.Token, &engine.Response{Status: http.StatusCreated}, time.Hour), true},
		{"Release", s.Release(ctx, id, c.Token), true},
		{"Extend", s.Extend(ctx, id, c.Token, time.Hour), true},
		{"Claim", func() error { _, err := s.Claim(ctx, id, "fp", time.Hour, time.Hour); return err }(), false},
		{"Lookup", func() error { _, err := s.Lookup(ctx, done); return err }(), false},
		{"Resolve", s.Resolve(ctx, done, nil, time.Hour), false},
	} {
		if !errors.Is(tc.err, memstore.ErrClosed) {
			t.Errorf("%s after Close error = %v, want ErrClosed", tc.op, tc.err)
		}
		if got := errors.Is(tc.err, engine.ErrLeaseLost); got != tc.leaseLost {
			t.Errorf("%s after Close error = %v: wraps ErrLeaseLost = %v, want %v", tc.op, tc.err, got, tc.leaseLost)
		}
	}
	if got, want := s.Complete(ctx, id, c.Token, &engine.Response{}, time.Hour).Error(), "memstore: complete: idempotency store closed: idempotency lease lost"; got != want {
		t.Errorf("Complete after Close error = %q, want %q", got, want)
	}
}

// TestCloseWhileRequestsRun: a request whose handler is running when the store
// is closed is answered as soon as its handler returns, not a store timeout
// or a lease later, and a server's shutdown does not wait for it either.
func TestCloseWhileRequestsRun(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	events := make(chan engine.Event, 8)
	mw, err := server.New(s,
		server.WithConfig(engine.Config{Lease: time.Hour, StoreTimeout: time.Hour, Logger: slog.New(slog.DiscardHandler), Observer: func(_ context.Context, e engine.Event) {
			if e.Kind != engine.EventAcquired {
				events <- e
			}
		}}),
	)
	if err != nil {
		t.Fatal(err)
	}
	running, finish := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(running)
		<-finish
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":1}`)
	})))
	stopped := false
	defer func() {
		// A server whose requests are held is left running when the
		// test fails, rather than waited for.
		if !stopped && !t.Failed() {
			srv.Close()
		}
	}()

	post := func(key string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		return srv.Client().Do(req)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := post("order-1")
		answered <- answer{resp, err}
	}()
	<-running
	s.Close()
	close(finish)

	// Bounds for a failure, far below the store timeout and the lease the
	// code before Close was defined made these wait for.
	const bound = 10 * time.Second
	select {
	case a := <-answered:
		if a.err != nil {
			t.Fatalf("request running at Close error = %v", a.err)
		}
		a.resp.Body.Close()
		if a.resp.StatusCode != http.StatusCreated {
			t.Errorf("request running at Close status = %d, want %d", a.resp.StatusCode, http.StatusCreated)
		}
	case <-time.After(bound):
		t.Fatalf("request running at Close not answered within %v of its handler's return", bound)
	}
	select {
	case e := <-events:
		if e.Kind != engine.EventNotStored || !errors.Is(e.Err, memstore.ErrClosed) {
			t.Errorf("event of the request running at Close = %v, %v; want not stored, ErrClosed", e.Kind, e.Err)
		}
	case <-time.After(bound):
		t.Fatalf("no event for the request running at Close within %v", bound)
	}

	// A request after Close is refused at once: nothing runs.
	resp, err := post("order-2")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("request after Close status = %d, want %d", resp.StatusCode, http.StatusServiceUnavailable)
	}

	shutdown := make(chan struct{})
	go func() {
		srv.Close()
		close(shutdown)
	}()
	select {
	case <-shutdown:
		stopped = true
	case <-time.After(bound):
		t.Fatalf("server not shut down within %v of Close", bound)
	}
}
