package idemtest_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/idemtest"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// Check an orders endpoint behind the server package's middleware. Every
// check applies: the target has a second credential for the cross-tenant
// check and a header that makes it fail for the 5xx check, and it takes keys
// both bare and quoted.
func ExampleCheck() {
	var created atomic.Int64
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Fail") != "" {
			http.Error(w, "induced failure", http.StatusInternalServerError)
			return
		}
		// The work takes a while, so that the concurrent check's
		// duplicates reach the middleware while the first runs: a test
		// endpoint for the kit takes 100ms or more (see What the kit
		// can see).
		time.Sleep(100 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, created.Add(1))
	})
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		fmt.Println(err)
		return
	}

	report, err := idemtest.Check(context.Background(), idemtest.Target{
		Handler:          mw.Handler(orders),
		Path:             "/orders",
		Header:           http.Header{"Authorization": {"Bearer alice"}, "Content-Type": {"application/json"}},
		Body:             idemtest.BodyTemplate(`{"sku":"A1","note":"{{variant}}"}`),
		SecondCredential: http.Header{"Authorization": {"Bearer bob"}},
		FailHeader:       http.Header{"X-Test-Fail": {"1"}},
		Policy: idemtest.Policy{
			KeyForm:   "both",
			MaxKeyLen: 255,
			// The middleware releases a key after a 5xx: require it.
			Release5xx: true,
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, res := range report.Results {
		fmt.Printf("%-16s %s\n", res.Name, res.Status)
	}
	fmt.Println(report.Summary())
	fmt.Println("policy:", report.Policy)
	fmt.Println("error:", report.Err())
	// Output:
	// first-request    pass
	// replay           pass
	// replay-marked    pass
	// key-mismatch     pass
	// missing-key      pass
	// malformed-key    pass
	// key-forms        pass
	// concurrent       pass
	// dropped-response pass
	// cross-tenant     pass
	// 5xx-not-cached   pass
	// problem-json     pass
	// 12 passed, 0 failed
	// policy: keys required, sent bare and quoted; keys of at most 255 bytes; release after 5xx required
	// error: <nil>
}

// A handler that ignores the key runs every request: the report names each
// broken promise.
func ExampleReport_Failed() {
	var created atomic.Int64
	ignoresKey := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, created.Add(1))
	})
	report, err := idemtest.Check(context.Background(), idemtest.Target{Handler: ignoresKey})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, res := range report.Failed() {
		fmt.Println(res.Name)
	}
	fmt.Println(report.Summary())
	// Output:
	// replay
	// key-mismatch
	// missing-key
	// malformed-key
	// concurrent
	// dropped-response
	// 1 passed, 6 failed, 5 not applicable
}

// A server that takes only UUIDs declares it, and one check, run alone,
// runs the checks whose evidence it needs first: here, first-request
// learns which keys the server takes. The keys one byte too short and one
// too long must then be refused with 400; this server answers them 500.
func ExampleTarget_keyLengths() {
	uuidsOnly := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(r.Header.Get("Idempotency-Key")) != 36 {
				http.Error(w, "bad key", http.StatusInternalServerError)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	var created atomic.Int64
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, created.Add(1))
	})
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	report, err := idemtest.Check(context.Background(), idemtest.Target{
		Handler: uuidsOnly(mw.Handler(orders)),
		Policy:  idemtest.Policy{MinKeyLen: 36, MaxKeyLen: 36},
		Checks:  []string{"malformed-key"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res := report.Results[0]
	fmt.Println(res.Name, res.Status)
	fmt.Println(res.Detail)
	fmt.Println("policy:", report.Policy)
	// Output:
	// malformed-key fail
	// Answered with a server error, which tells a client to retry a request that can never succeed: the empty key (500), the 37-byte key (500), the 35-byte key (500).
	// policy: keys required, sent bare; keys of exactly 36 bytes; release after 5xx advisory
}

// ordersApp stands for the application under test: an orders endpoint
// behind the server package's middleware, which fails when asked to by
// X-Test-Fail.
type ordersApp struct {
	store memstore.Store
	mw    *server.Middleware
}

func newOrdersApp() (*ordersApp, error) {
	store, err := memstore.New()
	if err != nil {
		return nil, err
	}
	mw, err := server.New(store)
	if err != nil {
		store.Close()
		return nil, err
	}
	return &ordersApp{store: store, mw: mw}, nil
}

// Routes returns the application's handler.
func (a *ordersApp) Routes() http.Handler {
	var created atomic.Int64
	return a.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Fail") != "" {
			http.Error(w, "induced failure", http.StatusInternalServerError)
			return
		}
		time.Sleep(100 * time.Millisecond) // the work, long enough for the concurrent check
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, created.Add(1))
	}))
}

// Close stops the application.
func (a *ordersApp) Close() {
	a.mw.Shutdown(context.Background())
	a.store.Close()
}

// What a Go test of an application does: Check its handler, served on a
// loopback port for the duration of the check, and fail on the report's
// error. In a test, ctx is t.Context(), and the two failures are t.Fatal
// and t.Error.
func ExampleCheck_goTest() {
	app, err := newOrdersApp()
	if err != nil {
		log.Fatal(err)
	}
	defer app.Close()

	ctx := context.Background() // in a test: t.Context()
	report, err := idemtest.Check(ctx, idemtest.Target{
		Handler:          app.Routes(), // or URL: "https://staging.example.com"
		Path:             "/orders",
		Header:           http.Header{"Authorization": {"Bearer test-alice"}, "Content-Type": {"application/json"}},
		Body:             idemtest.BodyTemplate(`{"sku":"A1","note":"{{variant}}"}`),
		SecondCredential: http.Header{"Authorization": {"Bearer test-bob"}},
		FailHeader:       http.Header{"X-Test-Fail": {"1"}},
		Policy:           idemtest.Policy{Release5xx: true}, // a retry after our 5xx runs again
	})
	if err != nil {
		log.Fatal(err) // t.Fatal: the target itself is unusable: no URL, a bad header, unreachable...
	}
	if err := report.Err(); err != nil {
		fmt.Println(err) // t.Error: every failed check, with the evidence
	}
	fmt.Println(report.Summary())
	// Output:
	// 11 passed, 0 failed, 1 not applicable
}
