package vendors_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
)

// A fake is an API's server, written from the behaviour its documentation
// describes (each vendor's constructor cites it): it takes keys in the
// vendor's header and within its limits, runs each key's operation once,
// and answers a repeated key as the vendor does: a replay (with the
// vendor's marker, if any), its refusal of a changed payload, or its
// in-flight answer while the first request still runs.
type fake struct {
	header string
	valid  func(key string) bool
	// check, if set, refuses a request before its key is looked at (OASIS's
	// first-sent rules).
	check func(w http.ResponseWriter, r *http.Request, body []byte) bool
	// decorate sets the vendor's headers on every answer to a keyed
	// request: echo on a first execution, replay on a repeat.
	decorate func(h http.Header, key string, first time.Time, repeat bool)
	// mismatch answers a repeated key with another payload; nil replays the
	// first outcome instead, as an API without a refusal does.
	mismatch func(w http.ResponseWriter)
	// inFlight answers a repeated key whose first request still runs.
	inFlight func(w http.ResponseWriter, first time.Time)

	mu      sync.Mutex
	records map[string]*record
	seen    []http.Header // the headers of every request, in order
	effects atomic.Int64  // operations run
	// hold, if set, is waited on by the first execution of each key.
	hold chan struct{}
	once sync.Once
}

type record struct {
	body   []byte
	first  time.Time
	done   bool
	status int
	resp   []byte
	// finished is closed once the first execution is done.
	finished chan struct{}
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.seen = append(f.seen, r.Header.Clone())
	f.mu.Unlock()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	key := r.Header.Get(f.header)
	if key == "" || !f.valid(key) {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if f.check != nil && !f.check(w, r, body) {
		return
	}
	f.mu.Lock()
	if f.records == nil {
		f.records = map[string]*record{}
	}
	rec := f.records[key]
	if rec == nil {
		rec = &record{body: body, first: time.Now(), finished: make(chan struct{})}
		f.records[key] = rec
		f.mu.Unlock()
		n := f.effects.Add(1)
		if f.hold != nil {
			<-f.hold
		}
		resp, _ := json.Marshal(map[string]any{"id": "op_" + strconv.FormatInt(n, 10)})
		f.mu.Lock()
		rec.done, rec.status, rec.resp = true, http.StatusCreated, resp
		f.mu.Unlock()
		close(rec.finished)
		f.write(w, key, rec, false)
		return
	}
	done, same := rec.done, bytes.Equal(rec.body, body)
	f.mu.Unlock()
	switch {
	case !same && f.mismatch != nil:
		f.mismatch(w)
	case !done:
		if f.hold != nil {
			// Let the first request finish, once this answer is on its
			// way, so that the next retry finds it done.
			f.release(rec)
		}
		f.inFlight(w, rec.first)
	default:
		f.write(w, key, rec, true)
	}
}

func (f *fake) write(w http.ResponseWriter, key string, rec *record, repeat bool) {
	if f.decorate != nil {
		f.decorate(w.Header(), key, rec.first, repeat)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rec.status)
	w.Write(rec.resp)
}

// release lets the first execution of rec finish and waits until it has.
func (f *fake) release(rec *record) {
	f.once.Do(func() { close(f.hold) })
	select {
	case <-rec.finished:
	case <-time.After(5 * time.Second):
	}
}

// keys returns the values of header h in every request, in order.
func (f *fake) keys(h string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.seen))
	for i, s := range f.seen {
		out[i] = s.Get(h)
	}
	return out
}

// jsonError writes status with doc as a JSON body.
func jsonError(w http.ResponseWriter, status int, doc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, doc)
}

// start serves f behind a fault proxy that gives the n-th request the
// fault of faults[n-1] (Pass beyond them), and returns the proxy's URL.
func start(t *testing.T, f *fake, faults ...faultnet.Fault) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(f)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	p, err := faultnet.Start(srv.URL, faultnet.Config{Decide: func(n int64, _ *http.Request) faultnet.Fault {
		if int(n) <= len(faults) {
			return faults[n-1]
		}
		return faultnet.Pass
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		if f.hold != nil {
			f.once.Do(func() { close(f.hold) })
		}
		srv.Close()
	})
	return p.URL()
}
