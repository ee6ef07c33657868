package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/server"
)

// handler is the application: it reads the request and answers 201 with
// 1 KiB.
func handler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(respBody)
}

// swapHandler serves the handler last set, so that a store can be replaced
// between phases behind the same listener. Every target, bare included,
// goes through one, so that its atomic load is in every phase alike.
type swapHandler struct{ h atomic.Pointer[http.Handler] }

func (s *swapHandler) set(h http.Handler) { s.h.Store(&h) }

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// meters are what a store's phase reads before and after.
type meters struct {
	// cpu is the store server's CPU time, false when it cannot be read.
	cpu func() (time.Duration, bool)
	// wire counts the store client's connections; nil for memstore.
	wire *wire
	// calls is the store server's count of calls, false when unknown.
	calls func(context.Context) (int64, bool)
}

// storeBench is one store under load.
type storeBench interface {
	// name is the store's name in the report.
	name() string
	// fill makes the store hold n prefilled completed records and the
	// replayed key's record (made through mw), before the phases of a
	// level. It returns what a record costs the store.
	fill(ctx context.Context, n int) ([]benchreport.SizeItem, error)
	// beforePhase readies the store for a phase; afterPhase undoes what the
	// phase did to it: the records of a first phase's keys, prefix-1 to
	// prefix-keys, are removed, so that every phase starts with the
	// records of its level.
	beforePhase(ctx context.Context) error
	afterPhase(ctx context.Context, kind, prefix string, keys int64) error
	// handler is the middleware, on the store, in front of the handler.
	handler() http.Handler
	meters() meters
	// close releases the store and what it holds.
	close()
}

// newMiddleware returns the middleware on store in front of the handler, as
// an application would set it up: the default options.
func newMiddleware(store engine.Store) (http.Handler, error) {
	mw, err := server.New(store)
	if err != nil {
		return nil, err
	}
	return mw.Handler(http.HandlerFunc(handler)), nil
}

// seedReplay sends, through h, the request that a replay phase repeats, so
// that its key's record is completed.
func seedReplay(h http.Handler, key string) error {
	req, err := newRequest("http://loadbench/orders", key)
	if err != nil {
		return err
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		return fmt.Errorf("loadbench: seeding the replayed key: status %d: %s", rec.Code, rec.Body)
	}
	return nil
}

// storedResponse is what the middleware stores for the handler's answer,
// for stores filled without going through it: a copy of its own, as the
// middleware keeps.
func storedResponse() *engine.Response {
	return &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   bytes.Clone(respBody),
	}
}

// prefillKey is the key of the i-th prefilled record.
func prefillKey(i int) string { return fmt.Sprintf("prefill-%d", i) }

// reading is what meters read at one moment.
type reading struct {
	cpu     time.Duration
	cpuOK   bool
	wire    wireCount
	calls   int64
	callsOK bool
}

// read reads every meter that m has.
func (m meters) read(ctx context.Context) reading {
	var r reading
	if m.cpu != nil {
		r.cpu, r.cpuOK = m.cpu()
	}
	if m.wire != nil {
		r.wire = m.wire.read()
	}
	if m.calls != nil {
		r.calls, r.callsOK = m.calls(ctx)
	}
	return r
}
