package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The run's requests, each answered 200 with the stats as JSON, or with an
// error's text:
//
//	GET  /loadbench/stats          what the counters say
//	POST /loadbench/reset?records=N  memory: a new, empty store, filled with N
//	                               records (keys prefill-1 to prefill-N)
//	POST /loadbench/kind?kind=K    the minimal statements: the path (first or
//	                               replay) that the coming requests take
//	POST /loadbench/gc             a garbage collection, before a phase
//	POST /loadbench/open           PostgreSQL: open the pool's connections
//	POST /loadbench/close          PostgreSQL: close them
//
// PostgreSQL's connections are open only during the phases of this server:
// every variant of a run has a pool of its own, and together they would
// exceed a shared server's max_connections.

// stats are what the server counted since it started.
type stats struct {
	Protocol int `json:"protocol"`
	// Writes and Bytes count what the store client did on its sockets:
	// each write is a round trip.
	Writes int64 `json:"writes"`
	Bytes  int64 `json:"bytes"`
}

// target is what the server serves on its store.
type target struct {
	h http.Handler
	// fresh makes a new store and its handler, and close releases the
	// current one: memory, whose records live in this process.
	fresh func() (http.Handler, func(), error)
	close func()
	// conns are PostgreSQL's connections.
	conns conns
	// kind is the minimal statements' handler.
	kind kinded
}

// conns are a store's connections to PostgreSQL.
type conns interface {
	// open opens n connections now, so that a phase does not pay for
	// them.
	open(ctx context.Context, n int) error
	// closeAll closes the idle connections.
	closeAll()
}

// kinded is a handler told which path the coming requests take.
type kinded interface {
	setReplay(replay bool)
}

// router routes the run's requests to the control, and the rest to the
// target's handler.
type router struct {
	wire *wire
	pool int
	t    target
	h    atomic.Pointer[http.Handler]
}

func (s *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/loadbench/") {
		s.control(w, r)
		return
	}
	(*s.h.Load()).ServeHTTP(w, r)
}

func (s *router) stats() stats {
	w := s.wire.read()
	return stats{Protocol: protocol, Writes: w.writes, Bytes: w.bytes}
}

func (s *router) control(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute)
	defer cancel()
	var err error
	switch strings.TrimPrefix(r.URL.Path, "/loadbench/") {
	case "stats":
	case "reset":
		err = s.reset(r.URL.Query().Get("records"))
	case "kind":
		switch k := r.URL.Query().Get("kind"); {
		case k != "first" && k != "replay":
			err = fmt.Errorf("unknown kind %q", k)
		case s.t.kind != nil:
			s.t.kind.setReplay(k == "replay")
		}
	case "gc":
		runtime.GC()
	case "open":
		if s.t.conns != nil {
			err = s.t.conns.open(ctx, s.pool)
		}
	case "close":
		if s.t.conns != nil {
			s.t.conns.closeAll()
		}
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s.stats())
}

// reset replaces the memory store with a new one holding records records,
// each stored through the new handler, as a request would store it.
func (s *router) reset(records string) error {
	if s.t.fresh == nil {
		return fmt.Errorf("reset: only the memory store is reset")
	}
	n, err := strconv.Atoi(records)
	if err != nil || n < 0 {
		return fmt.Errorf("reset: records=%q, want a count", records)
	}
	h, closeStore, err := s.t.fresh()
	if err != nil {
		return err
	}
	// A new minimal handler takes the first path, the one that stores,
	// until it is told otherwise (after the reset, by the run).
	body := bytes.Repeat([]byte("p"), 1024)
	for i := 1; i <= n; i++ {
		req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", "prefill-"+strconv.Itoa(i))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			closeStore()
			return fmt.Errorf("reset: filling: status %d: %s", rec.Code, rec.Body)
		}
	}
	old := s.t.close
	s.t.close = closeStore
	if k, ok := h.(kinded); ok {
		s.t.kind = k
	}
	s.h.Store(&h)
	if old != nil {
		old()
	}
	return nil
}
