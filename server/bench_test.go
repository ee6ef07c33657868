package server_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
)

// BenchmarkMiddleware measures what the middleware adds to a handler, in
// process: bare is the handler alone; first runs it under a new key each
// time; replay answers from the stored response. The differences between
// bare and the others are the middleware's cost.
func BenchmarkMiddleware(b *testing.B) {
	reqBody := bytes.Repeat([]byte("q"), 1024)
	respBody := bytes.Repeat([]byte("r"), 1024)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(respBody)
	})
	store := memstore.New()
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		b.Fatal(err)
	}
	protected := mw.Handler(handler)
	// current lets the "first" benchmark swap in a fresh store.
	current := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { protected.ServeHTTP(w, r) })
	keys := make([]string, 0, 1<<16)
	for i := range cap(keys) {
		keys = append(keys, "key-"+strconv.Itoa(i))
	}

	run := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.ReportAllocs()
		rd := bytes.NewReader(reqBody)
		req := httptest.NewRequest(http.MethodPost, "/orders", rd)
		w := &discard{h: http.Header{}}
		i := 0
		for b.Loop() {
			rd.Reset(reqBody)
			req.Header = http.Header{"Idempotency-Key": {key(i)}}
			clear(w.h)
			h.ServeHTTP(w, req)
			if w.status != http.StatusCreated {
				b.Fatalf("status %d", w.status)
			}
			i++
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, handler, func(i int) string { return keys[i%len(keys)] }) })
	b.Run("first", func(b *testing.B) {
		// Keys cycle through a fresh store every len(keys) requests, so
		// that the store's growth, and the collector's work on it, is the
		// same at every b.N.
		run(b, current, func(i int) string {
			if i%len(keys) == 0 && i > 0 {
				b.StopTimer()
				store.Close()
				store = memstore.New()
				mw, _ = server.New(store)
				protected = mw.Handler(handler)
				b.StartTimer()
			}
			return keys[i%len(keys)]
		})
	})
	b.Run("replay", func(b *testing.B) { run(b, current, func(int) string { return "key-0" }) })
}

// discard is a minimal ResponseWriter, so that the benchmark measures the
// middleware rather than a recorder.
type discard struct {
	h      http.Header
	status int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(code int)        { d.status = code }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
