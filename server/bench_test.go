package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/keyfield"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// BenchmarkMiddleware measures what the middleware adds to a handler, in
// process, with a 1 KiB request and response body:
//
//   - bare: the handler alone;
//   - first-nostore: a new key each time, on a Store that grants every claim
//     and keeps nothing: the middleware's own cost on a first execution;
//   - first: a new key each time on memstore, which keeps every response:
//     the above plus the store's map and the collector's work on what it
//     keeps (a fresh store every 65,536 keys, so that this is the same at
//     every b.N);
//   - replay: one key, answered from memstore every time;
//   - first-redis, replay-redis: the same on redisstore, over loopback to the
//     test Redis (skipped without one).
//
// The differences from bare are the middleware's cost.
func BenchmarkMiddleware(b *testing.B) {
	reqBody := bytes.Repeat([]byte("q"), 1024)
	respBody := bytes.Repeat([]byte("r"), 1024)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(respBody)
	})
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	newKey := func(i int) string { return keys[i%len(keys)] }
	protect := func(b *testing.B, store engine.Store) http.Handler {
		mw, err := server.New(store)
		if err != nil {
			b.Fatal(err)
		}
		return mw.Handler(handler)
	}
	run := func(b *testing.B, h func(i int) http.Handler, key func(i int) string) {
		runtime.GC()
		b.ReportAllocs()
		rd := bytes.NewReader(reqBody)
		req := httptest.NewRequest(http.MethodPost, "/orders", rd)
		w := &discard{h: http.Header{}}
		i := 0
		for b.Loop() {
			rd.Reset(reqBody)
			req.Header = http.Header{"Idempotency-Key": {key(i)}}
			clear(w.h)
			h(i).ServeHTTP(w, req)
			if w.status != http.StatusCreated {
				b.Fatalf("status %d", w.status)
			}
			i++
		}
	}

	b.Run("bare", func(b *testing.B) {
		run(b, func(int) http.Handler { return handler }, newKey)
	})
	b.Run("first-nostore", func(b *testing.B) {
		h := protect(b, acquireAll{})
		run(b, func(int) http.Handler { return h }, newKey)
	})
	b.Run("first", func(b *testing.B) {
		var store memstore.Store
		var h http.Handler
		defer func() { store.Close() }()
		run(b, func(i int) http.Handler {
			if i%len(keys) == 0 {
				b.StopTimer()
				if store != nil {
					store.Close()
				}
				var err error
				if store, err = memstore.New(); err != nil {
					b.Fatal(err)
				}
				h = protect(b, store)
				runtime.GC()
				b.StartTimer()
			}
			return h
		}, newKey)
	})
	b.Run("replay", func(b *testing.B) {
		store, err := memstore.New()
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		h := protect(b, store)
		run(b, func(int) http.Handler { return h }, func(int) string { return "key-0" })
	})
	// The same on Redis, whose client asks for the contexts' Done channels
	// and deadlines: what the middleware's contexts cost on a network
	// store. Unique keys across runs: b.N restarts from zero.
	var redisRun atomic.Int64
	b.Run("first-redis", func(b *testing.B) {
		h := protect(b, teststores.Redis(b))
		prefix := "r" + strconv.FormatInt(redisRun.Add(1), 10) + "-"
		run(b, func(int) http.Handler { return h }, func(i int) string { return prefix + strconv.Itoa(i) })
	})
	b.Run("replay-redis", func(b *testing.B) {
		h := protect(b, teststores.Redis(b))
		run(b, func(int) http.Handler { return h }, func(int) string { return "key-0" })
	})
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

// acquireAll is a Store that grants every claim and keeps nothing.
type acquireAll struct{}

func (acquireAll) Claim(context.Context, engine.ID, string, time.Duration, time.Duration) (engine.Claim, error) {
	return engine.Claim{Status: engine.Acquired, Token: 1}, nil
}

func (acquireAll) Complete(context.Context, engine.ID, engine.Token, *engine.Response, time.Duration) error {
	return nil
}
func (acquireAll) Release(context.Context, engine.ID, engine.Token) error { return nil }
func (acquireAll) Extend(context.Context, engine.ID, engine.Token, time.Duration) error {
	return nil
}

// BenchmarkFloor measures what no idempotency middleware can avoid on the
// requests of BenchmarkMiddleware: the key's parse, and the fingerprint of
// a 1 KiB body (its SHA-256, and one more over the method, path and
// query), which a replay needs too, to refuse a key reused for another
// request.
func BenchmarkFloor(b *testing.B) {
	body := bytes.Repeat([]byte("q"), 1024)
	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	b.Run("key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := keyfield.Parse("key-12345"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fingerprint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := server.Fingerprint(req, body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
