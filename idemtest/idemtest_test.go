package idemtest_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemtest"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// orders creates an order per execution and answers with its number. A
// request with the X-Fail header fails with 500 before creating anything.
type orders struct {
	created atomic.Int64
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.Header.Get("X-Fail") != "" {
		http.Error(w, "induced failure", http.StatusInternalServerError)
		return
	}
	n := o.created.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"request":%q}`, n, body)
}

// protect puts our middleware, with a fresh memory store, in front of h,
// which takes up to overlapWindow per request, or burstWindow for the
// concurrent check's (see overlap).
func protect(t *testing.T, h http.Handler, opts ...server.Option) http.Handler {
	t.Helper()
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store, opts...)
	require.NoError(t, err)
	return newBurstOverlap().around(mw.Handler, h)
}

// overlapWindow is how long a handler behind overlap runs at most;
// burstWindow, how long for a request with Expect: 100-continue, as the
// concurrent check sends them.
const (
	overlapWindow = 50 * time.Millisecond
	burstWindow   = time.Second
)

// overlap holds each run of a handler behind a middleware until a duplicate
// of its request (one with the same key) has been answered, or for the
// window at most. The handler of a real endpoint takes time, and this makes
// the concurrent check's requests overlap without depending on the
// scheduler: while the first runs, a duplicate can only be answered 409.
// The concurrent check's requests, which come with Expect: 100-continue,
// are held for up to burstWindow rather than the window, so that a
// duplicate whose claim is slow (a new connection to the store) still
// meets the first in flight; once a duplicate of any key has been
// answered, the others go on, and those that come within burstWindow after
// (the request under another key among them) are held for the window only;
// the requests of the other checks, and the concurrent check's own
// requests timed alone, are held for the window.
// Behind a middleware that makes duplicates wait (engine.Config.Wait), the
// handler runs for the whole window, and holds the duplicates as long:
// there, newOverlap's window applies to every request.
type overlap struct {
	window, burst time.Duration

	mu      sync.Mutex
	running map[string]chan struct{} // per key: closed when a duplicate is answered
	settled chan struct{}            // closed, and replaced, when a duplicate is answered
	lastAt  time.Time                // when a duplicate was last answered
}

type ranKey struct{}

func newOverlap(window time.Duration) *overlap {
	return &overlap{window: window, burst: window, running: map[string]chan struct{}{}, settled: make(chan struct{})}
}

// newBurstOverlap is newOverlap, holding the concurrent check's requests
// for up to burstWindow.
func newBurstOverlap() *overlap {
	o := newOverlap(overlapWindow)
	o.burst = burstWindow
	return o
}

// around returns h behind the middleware mw, held as overlap says.
func (o *overlap) around(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
	protected := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ran, ok := r.Context().Value(ranKey{}).(*atomic.Bool); ok {
			ran.Store(true)
		}
		key := r.Header.Get("Idempotency-Key")
		answered := make(chan struct{})
		o.mu.Lock()
		o.running[key] = answered
		var settled chan struct{} // nil, which never ends a wait, but in a burst
		window := o.window
		if r.Header.Get("Expect") != "" && time.Since(o.lastAt) > o.burst {
			settled, window = o.settled, o.burst
		}
		o.mu.Unlock()
		timer := time.NewTimer(window)
		select {
		case <-answered:
		case <-settled:
		case <-timer.C:
		case <-r.Context().Done():
		}
		timer.Stop()
		o.mu.Lock()
		if o.running[key] == answered {
			delete(o.running, key)
		}
		o.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran := new(atomic.Bool)
		protected.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ranKey{}, ran)))
		if ran.Load() {
			return
		}
		key := r.Header.Get("Idempotency-Key")
		o.mu.Lock()
		if answered := o.running[key]; answered != nil {
			close(answered)
			delete(o.running, key)
			close(o.settled)
			o.settled, o.lastAt = make(chan struct{}), time.Now()
		}
		o.mu.Unlock()
	})
}

// start serves h on loopback until the test ends.
func start(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// target describes the orders endpoint of a server at url, with everything
// the kit needs to run every check.
func target(url string) idemtest.Target {
	return idemtest.Target{
		URL:  url,
		Path: "/orders",
		Header: http.Header{
			"Authorization": {"Bearer alice"},
			"Content-Type":  {"application/json"},
		},
		Body:             idemtest.BodyTemplate(`{"sku":"A1","note":"{{variant}}"}`),
		SecondCredential: http.Header{"Authorization": {"Bearer bob"}},
		FailHeader:       http.Header{"X-Fail": {"1"}},
	}
}

func check(t *testing.T, tg idemtest.Target) *idemtest.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	report, err := idemtest.Check(ctx, tg)
	require.NoError(t, err)
	return report
}

func statuses(r *idemtest.Report) map[string]idemtest.Status {
	m := make(map[string]idemtest.Status)
	for _, res := range r.Results {
		m[res.Name] = res.Status
	}
	return m
}

func names(infos []idemtest.CheckInfo) []string {
	var out []string
	for _, c := range infos {
		out = append(out, c.Name)
	}
	return out
}

// assertAll asserts that every check ran, in order, with the given status.
func assertAll(t *testing.T, report *idemtest.Report, want idemtest.Status) {
	t.Helper()
	var got []string
	for _, res := range report.Results {
		got = append(got, res.Name)
		assert.Equal(t, want, res.Status, "%s: %s\nsent: %s\ngot: %s", res.Name, res.Detail, res.Sent, res.Got)
	}
	assert.Equal(t, names(idemtest.Checks()), got)
}

// stores are the Stores our server is checked with. pgstore and redisstore
// join them when they land.
func stores() map[string]func(t *testing.T) engine.Store {
	m := map[string]func(t *testing.T) engine.Store{}
	for _, k := range teststores.All() {
		m[k.Name] = func(t *testing.T) engine.Store { return k.New(t) }
	}
	return m
}

func TestOurServerPasses(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			h := &orders{}
			mw, err := server.New(newStore(t))
			require.NoError(t, err)
			srv := start(t, newBurstOverlap().around(mw.Handler, h))
			tg := target(srv.URL)
			tg.KeyForm = idemtest.KeyBoth
			tg.MaxKeyLen = 255
			tg.Require5xxRelease = true
			report := check(t, tg)
			assertAll(t, report, idemtest.StatusPass)
			assert.NoError(t, report.Err())
			assert.Equal(t, srv.URL+"/orders", report.Target)
			n := len(idemtest.Checks())
			assert.Equal(t, fmt.Sprintf("%d passed, 0 failed", n), report.Summary())
			// Few resources: one order per check that needs a success,
			// one per key in key-forms, four for the concurrent check
			// (the duplicates, two requests timed alone, and one under
			// another key), one per caller in cross-tenant.
			assert.LessOrEqual(t, h.created.Load(), int64(n+4))
			res, _ := report.Result("concurrent")
			// The overlap holds the first until a duplicate is answered:
			// 409, as the middleware answers a key in flight.
			assert.Contains(t, res.Detail, "answered 409 while the first was in flight")
			assert.Equal(t, idemtest.Policy{KeyForm: idemtest.KeyBoth, MaxKeyLen: 255, KeyAlphabet: idemtest.AlphabetASCII, Release5xx: true}, report.Policy)
			assert.Empty(t, report.Notes)
		})
	}
}

func TestHandlerInProcess(t *testing.T) {
	tg := target("")
	tg.Handler = protect(t, &orders{})
	tg.KeyForm = idemtest.KeyBoth
	report := check(t, tg)
	assertAll(t, report, idemtest.StatusPass)
	assert.True(t, strings.HasPrefix(report.Target, "http://127.0.0.1:"), report.Target)
}

func TestWaitingServerPasses(t *testing.T) {
	// With a Wait, concurrent duplicates wait and get the replay
	// instead of 409: the first answer's delay shows that they waited.
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store, server.WithConfig(engine.Config{Wait: 5 * time.Second}))
	require.NoError(t, err)
	srv := start(t, newOverlap(200*time.Millisecond).around(mw.Handler, &orders{}))
	tg := target(srv.URL)
	tg.Checks = []string{"first-request", "replay", "concurrent", "dropped-response"}
	report := check(t, tg)
	for _, res := range report.Results {
		assert.Equal(t, idemtest.StatusPass, res.Status, "%s: %s\n%s", res.Name, res.Detail, res.Got)
	}
	res, _ := report.Result("concurrent")
	assert.Contains(t, res.Detail, "No 409, but the duplicates waited for the first")
	assert.Contains(t, res.Got, "9 × 201 Created", "the replays")
}

// slowly runs h after d, as an endpoint that does some work does.
func slowly(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
		}
		h.ServeHTTP(w, r)
	})
}

// TestConcurrentSlowServerPasses: behind our middleware, an endpoint that
// takes 250ms passes the concurrent check, by a 409 or, with a Wait, by
// the duplicates' wait, without any help from the test (no overlap
// wrapper).
func TestConcurrentSlowServerPasses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []server.Option
		detail string
	}{
		{"409", nil, "answered 409 while the first was in flight"},
		{"waits", []server.Option{server.WithConfig(engine.Config{Wait: 5 * time.Second})}, "No 409, but the duplicates waited for the first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := server.New(teststores.Memory(t), tc.opts...)
			require.NoError(t, err)
			srv := start(t, mw.Handler(slowly(250*time.Millisecond, &orders{})))
			tg := target(srv.URL)
			tg.Checks = []string{"concurrent"}
			for i := range 2 {
				res := check(t, tg).Results[0]
				assert.Equal(t, idemtest.StatusPass, res.Status, "run %d: %s\n%s", i, res.Detail, res.Got)
				assert.Contains(t, res.Detail, tc.detail, "run %d", i)
			}
		})
	}
}

func TestNotApplicable(t *testing.T) {
	srv := start(t, protect(t, &orders{}, server.WithKeyOptional()))
	tg := target(srv.URL)
	tg.KeysOptional = true
	tg.SecondCredential = nil
	tg.FailHeader = nil
	report := check(t, tg)
	assert.NoError(t, report.Err())
	for name, status := range statuses(report) {
		want := idemtest.StatusPass
		switch name {
		case "missing-key", "cross-tenant", "5xx-not-cached", "key-forms":
			want = idemtest.StatusNotApplicable
		}
		assert.Equal(t, want, status, name)
	}
	res, _ := report.Result("cross-tenant")
	assert.Contains(t, res.Detail, "second credential")
	res, _ = report.Result("key-forms")
	assert.Contains(t, res.Detail, "-key-form both")
	assert.Equal(t, "8 passed, 0 failed, 4 not applicable", report.Summary())
}

func TestAdvisories(t *testing.T) {
	plain := func(w http.ResponseWriter, r *http.Request, err error) {
		var e *server.Error
		if assert.ErrorAs(t, err, &e) {
			http.Error(w, e.Title, e.Status)
		}
	}
	srv := start(t, protect(t, &orders{}, server.WithReplayedHeader("X-Replayed"), server.WithErrorWriter(plain)))
	report := check(t, target(srv.URL))
	assert.NoError(t, report.Err(), "advisories are not failures")
	got := statuses(report)
	assert.Equal(t, idemtest.StatusAdvisory, got["replay-marked"])
	assert.Equal(t, idemtest.StatusAdvisory, got["problem-json"])
	res, _ := report.Result("problem-json")
	assert.Contains(t, res.Detail, "the 400 answer seen by missing-key is not application/problem+json")
	assert.Contains(t, res.Detail, "The 422 answer seen by key-mismatch")
	assert.Equal(t, "9 passed, 0 failed, 1 not applicable, 2 advisory", report.Summary())

	// With the replay header named, replays are marked.
	tg := target(srv.URL)
	tg.ReplayedHeader = "x-replayed"
	report = check(t, tg)
	assert.Equal(t, idemtest.StatusPass, statuses(report)["replay-marked"])
}

func TestFirstRequestFails(t *testing.T) {
	h := &orders{}
	auth := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer carol" {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
	srv := start(t, protect(t, auth))
	report := check(t, target(srv.URL))
	got := statuses(report)
	assert.Equal(t, idemtest.StatusFail, got["first-request"])
	for _, name := range []string{"replay", "key-mismatch", "concurrent",
		"dropped-response", "cross-tenant", "5xx-not-cached"} {
		assert.Equal(t, idemtest.StatusNotApplicable, got[name], name)
		res, _ := report.Result(name)
		assert.Contains(t, res.Detail, "first-request check failed")
	}
	// The middleware refuses bad keys before the handler sees them.
	assert.Equal(t, idemtest.StatusPass, got["missing-key"])
	assert.Equal(t, idemtest.StatusPass, got["malformed-key"])
	res, _ := report.Result("first-request")
	assert.Contains(t, res.Got, "401 Unauthorized")
	assert.NotContains(t, res.Sent, "alice", "credentials never appear in a report")
	assert.Equal(t, int64(0), h.created.Load())
}

func TestOnlyNamedChecks(t *testing.T) {
	srv := start(t, protect(t, &orders{}))
	tg := target(srv.URL)
	tg.Checks = []string{"replay-marked", "replay"}
	report := check(t, tg)
	require.Len(t, report.Results, 2)
	assert.Equal(t, "replay", report.Results[0].Name, "checks run in their own order")
	assertAll := func() {
		for _, res := range report.Results {
			assert.Equal(t, idemtest.StatusPass, res.Status, res.Name)
		}
	}
	assertAll()

	// Alone, it runs the checks whose evidence it needs, unreported.
	tg.Checks = []string{"replay-marked"}
	report = check(t, tg)
	require.Len(t, report.Results, 1)
	assert.Equal(t, idemtest.StatusPass, report.Results[0].Status, report.Results[0].Detail)
}

// dropped serves orders behind our middleware for the dropped-response
// check, in a set order. The check's dropped request is the first that
// asks for its connection to be closed (the kit's raw connections do; the
// requests of the checks it depends on come through a client that keeps
// them). Its run of the handler waits until its client has gone; then,
// with inFlight, until a retry has been answered 409 (the first is still in
// flight); without, the retries wait outside the middleware until the first
// run has been answered (the first is done). It returns how many times the
// handler ran for the dropped request's key.
func dropped(t *testing.T, inFlight bool, opts ...server.Option) (http.Handler, *atomic.Int64) {
	t.Helper()
	h := &orders{}
	conflict, firstDone := make(chan struct{}), make(chan struct{})
	var sawConflict sync.Once
	var claimed atomic.Bool
	var droppedKey atomic.Value // string
	ran := new(atomic.Int64)
	isDropped := func(r *http.Request) bool {
		k, _ := droppedKey.Load().(string)
		return k != "" && r.Header.Get("Idempotency-Key") == k
	}
	var runs atomic.Int64
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isDropped(r) {
			ran.Add(1)
			if runs.Add(1) == 1 {
				<-r.Context().Done()
				if inFlight {
					timer := time.NewTimer(10 * time.Second)
					select {
					case <-conflict:
					case <-timer.C:
					}
					timer.Stop()
				}
			}
		}
		h.ServeHTTP(w, r)
	})
	protected := protect(t, inner, opts...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Close && claimed.CompareAndSwap(false, true) {
			droppedKey.Store(r.Header.Get("Idempotency-Key"))
			defer close(firstDone)
			protected.ServeHTTP(w, r)
			return
		}
		if !isDropped(r) {
			protected.ServeHTTP(w, r)
			return
		}
		if !inFlight {
			select {
			case <-firstDone:
			case <-r.Context().Done():
				return
			}
		}
		rec := &statusRecorder{ResponseWriter: w}
		protected.ServeHTTP(rec, r)
		if rec.status == http.StatusConflict {
			sawConflict.Do(func() { close(conflict) })
		}
	}), ran
}

// TestDroppedWording: what the dropped-response check says follows what it
// saw: whether the retry found the first in flight, and whether the answer
// it got was marked as a replay.
func TestDroppedWording(t *testing.T) {
	unknown := server.WithReplayedHeader("X-Unknown") // not one the kit recognises
	for _, tc := range []struct {
		name      string
		inFlight  bool
		opts      []server.Option
		want      string
		notWanted string
	}{
		{"in flight, marked", true, nil,
			"The first request was still in flight when the retry came (N409 Conflict (in flight)), and the retries then got its answer, marked as a replay: the request ran once.", "cannot tell"},
		{"done, marked", false, nil,
			"The retries got the first request's answer, marked as a replay: the request ran once, although its client went away.", "in flight"},
		{"in flight, unmarked", true, []server.Option{unknown},
			"The first request was still in flight when the retry came (N409 Conflict (in flight)); then the retries got a success, the same twice, not marked as a replay. It is the first request's answer, or a second execution after the target released the key", "ran once"},
		{"done, unmarked", false, []server.Option{unknown},
			"no 409 came first: it is the first request's answer, or a second execution, and without a replay header the kit cannot tell which.", "in flight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, ran := dropped(t, tc.inFlight, tc.opts...)
			srv := start(t, h)
			tg := target(srv.URL)
			tg.Checks = []string{"dropped-response"}
			report := check(t, tg)
			res := report.Results[0]
			assert.Equal(t, idemtest.StatusPass, res.Status, "%s\n%s", res.Detail, res.Got)
			assert.Contains(t, res.Got, "nothing before the close")
			// N stands for how many 409s came before the answer, which
			// depends on timing: "" for one, "2 × " for two.
			want := regexp.QuoteMeta(tc.want)
			want = strings.ReplaceAll(want, "N409", `(\d+ × )?409`)
			assert.Regexp(t, want, res.Detail)
			assert.NotContains(t, res.Detail, tc.notWanted)
			assert.Equal(t, int64(1), ran.Load(), "runs of the dropped request")
		})
	}
}

// TestDroppedAndStuck: a target that never finishes a request whose client
// went away leaves its key in flight, and the retry never settles.
func TestDroppedAndStuck(t *testing.T) {
	release := make(chan struct{})
	h := &orders{}
	stuck := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Close { // the dropped request, on the kit's raw connection
			<-release
		}
		h.ServeHTTP(w, r)
	})
	srv := start(t, protect(t, stuck))
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers
	tg := target(srv.URL)
	tg.Checks = []string{"dropped-response"}
	tg.Patience = 300 * time.Millisecond
	report := check(t, tg)
	res := report.Results[0]
	assert.Equal(t, idemtest.StatusFail, res.Status)
	assert.Contains(t, res.Detail, "still in flight")
	assert.Contains(t, report.Err().Error(), "dropped-response: The key was still in flight")
}

func TestTargetErrors(t *testing.T) {
	ok := target("http://127.0.0.1:1")
	for name, tc := range map[string]struct {
		edit func(*idemtest.Target)
		want string
	}{
		"no URL":        {func(tg *idemtest.Target) { tg.URL = "" }, "needs a URL or a Handler"},
		"both":          {func(tg *idemtest.Target) { tg.Handler = http.NotFoundHandler() }, "both a URL and a Handler"},
		"scheme":        {func(tg *idemtest.Target) { tg.URL = "ftp://example.com" }, "not an http or https URL"},
		"unparsable":    {func(tg *idemtest.Target) { tg.URL = "http://[::1" }, "Target.URL"},
		"path":          {func(tg *idemtest.Target) { tg.Path = "orders" }, "does not start with /"},
		"method":        {func(tg *idemtest.Target) { tg.Method = "PO ST" }, "not a valid method"},
		"concurrency":   {func(tg *idemtest.Target) { tg.Concurrency = 1 }, "Concurrency 1"},
		"timeout":       {func(tg *idemtest.Target) { tg.Timeout = -time.Second }, "Timeout -1s is negative"},
		"key in header": {func(tg *idemtest.Target) { tg.Header.Set("idempotency-key", "x") }, "contains the key header"},
		"header value":  {func(tg *idemtest.Target) { tg.FailHeader = http.Header{"X-Fail": {"a\nb"}} }, "FailHeader: header X-Fail has an invalid value"},
		"header name":   {func(tg *idemtest.Target) { tg.KeyHeader = "Key:" }, "not a valid header name"},
		"unknown check": {func(tg *idemtest.Target) { tg.Checks = []string{"replay", "nope"} }, `no check is named "nope"; the checks are first-request, replay, `},
		"key form":      {func(tg *idemtest.Target) { tg.KeyForm = "shouted" }, `Target.KeyForm "shouted" is not "bare", "quoted" or "both"`},
		"key length":    {func(tg *idemtest.Target) { tg.MaxKeyLen = -1 }, "MaxKeyLen -1 is negative"},
		"huge key":      {func(tg *idemtest.Target) { tg.MaxKeyLen = 1 << 20 }, "MaxKeyLen 1048576 is over 4096"},
		"credentials":   {func(tg *idemtest.Target) { tg.URL = "http://u:secret@127.0.0.1:1" }, "credentials in it"},
		"same caller":   {func(tg *idemtest.Target) { tg.SecondCredential = http.Header{"authorization": {"Bearer alice"}} }, "needs another caller"},
		"same variants": {func(tg *idemtest.Target) { tg.Body = func(int) []byte { return []byte("x") } }, "same body for variants 0 and 1"},
	} {
		t.Run(name, func(t *testing.T) {
			tg := ok
			tg.Header = ok.Header.Clone()
			tc.edit(&tg)
			report, err := idemtest.Check(t.Context(), tg)
			assert.Nil(t, report)
			if assert.Error(t, err) {
				assert.Contains(t, err.Error(), tc.want)
				assert.True(t, strings.HasPrefix(err.Error(), "idemtest: "), err.Error())
			}
		})
	}
}

func TestCancelled(t *testing.T) {
	srv := start(t, protect(t, &orders{}))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	report, err := idemtest.Check(ctx, target(srv.URL))
	assert.ErrorIs(t, err, context.Canceled)
	require.NotNil(t, report)
	assert.Empty(t, report.Results)
}

func TestCancelledMidCheck(t *testing.T) {
	started := make(chan struct{}, 1)
	h := &orders{}
	blocks := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			started <- struct{}{}
			<-r.Context().Done()
			return
		}
		h.ServeHTTP(w, r)
	})
	srv := start(t, protect(t, blocks))
	tg := target(srv.URL)
	tg.Checks = []string{"missing-key", "5xx-not-cached"}
	tg.FailHeader = http.Header{"X-Block": {"1"}} // the 5xx check's first request blocks
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		select {
		case <-started:
		case <-ctx.Done():
		}
		cancel()
	}()
	report, err := idemtest.Check(ctx, tg)
	assert.ErrorIs(t, err, context.Canceled)
	require.NotNil(t, report)
	assert.Equal(t, []string{"missing-key"}, func() (names []string) {
		for _, res := range report.Results {
			names = append(names, res.Name)
		}
		return names
	}(), "the check cut short is not reported")
}

func TestUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	tg := target(url)
	tg.Timeout = 2 * time.Second
	report, err := idemtest.Check(t.Context(), tg)
	assert.Nil(t, report, "no checks ran")
	require.ErrorIs(t, err, idemtest.ErrUnreachable)
	assert.Contains(t, err.Error(), "idemtest: target unreachable: "+strings.TrimPrefix(url, "http://")+": dial tcp")
}

func TestBodyTemplate(t *testing.T) {
	body := idemtest.BodyTemplate(`{"a":"{{variant}}","b":{{variant}}}`)
	assert.Equal(t, `{"a":"0","b":0}`, string(body(0)))
	assert.Equal(t, `{"a":"1","b":1}`, string(body(1)))
	plain := idemtest.BodyTemplate(`{"a":1}`)
	assert.Equal(t, `{"a":1}`, string(plain(0)))
	assert.Equal(t, `{"a":1} `, string(plain(1)))
	assert.Equal(t, `{"a":1}  `, string(plain(2)))
}

func TestDefaultBody(t *testing.T) {
	var got atomic.Value
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(r.Header.Get("Content-Type") + " " + string(b))
		w.WriteHeader(http.StatusCreated)
	})
	srv := start(t, protect(t, h))
	report := check(t, idemtest.Target{URL: srv.URL, Checks: []string{"first-request"}})
	assert.Equal(t, idemtest.StatusPass, report.Results[0].Status)
	assert.Equal(t, `application/json {"idemtest_variant":0}`, got.Load())
}

func TestReportErr(t *testing.T) {
	r := &idemtest.Report{Results: []idemtest.Result{
		{Name: "replay", Status: idemtest.StatusFail, Sent: "POST /", Got: "201\n201", Want: "same", Detail: "It ran twice."},
		{Name: "replay-marked", Status: idemtest.StatusAdvisory},
		{Name: "concurrent", Status: idemtest.StatusFail, Detail: "Two successes."},
		{Name: "cross-tenant", Status: idemtest.StatusNotApplicable},
		{Name: "first-request", Status: idemtest.StatusPass},
	}}
	err := r.Err()
	require.Error(t, err)
	assert.Equal(t, "idemtest: 2 checks failed:\n"+
		"replay: It ran twice.\n\tsent: POST /\n\tgot: 201\n\t\t201\n\twant: same\n"+
		"concurrent: Two successes.", err.Error())
	assert.Equal(t, "1 passed, 2 failed, 1 not applicable, 1 advisory", r.Summary())
	assert.Len(t, r.Failed(), 2)
	assert.NoError(t, (&idemtest.Report{}).Err())
}

func TestChecksDescribed(t *testing.T) {
	infos := idemtest.Checks()
	seen := map[string]bool{}
	for _, c := range infos {
		assert.NotEmpty(t, c.Description, c.Name)
		assert.False(t, seen[c.Name], "duplicate %s", c.Name)
		seen[c.Name] = true
	}
	advisory := slices.DeleteFunc(slices.Clone(infos), func(c idemtest.CheckInfo) bool { return !c.Advisory })
	assert.Equal(t, []string{"replay-marked", "problem-json"}, names(advisory))
	policies := slices.DeleteFunc(slices.Clone(infos), func(c idemtest.CheckInfo) bool { return c.Policy == "" })
	assert.Equal(t, []string{"5xx-not-cached"}, names(policies))
	assert.Equal(t, "release-5xx", policies[0].Policy)
}

// TestMalformedKeysReachTheHandler: the malformed keys are ones that an
// HTTP server lets through to the application, as long as a valid key, so
// that a refusal comes from the code that reads keys, not from the parser.
func TestMalformedKeysReachTheHandler(t *testing.T) {
	for _, form := range []idemtest.KeyForm{idemtest.KeyBare, idemtest.KeyQuoted} {
		t.Run(string(form), func(t *testing.T) {
			var mu sync.Mutex
			var seen []string
			o := &orders{}
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				value := r.Header.Get("Idempotency-Key")
				key := value
				if form == idemtest.KeyQuoted {
					key = strings.TrimSuffix(strings.TrimPrefix(value, `"`), `"`)
				}
				if plainKey(key) && len(key) <= 40 && key != value == (form == idemtest.KeyQuoted) {
					o.ServeHTTP(w, r)
					return
				}
				mu.Lock()
				seen = append(seen, r.Header.Values("Idempotency-Key")...)
				mu.Unlock()
				http.Error(w, "invalid key", http.StatusBadRequest)
			})
			srv := start(t, h)
			tg := target(srv.URL)
			tg.KeyForm = form
			tg.MaxKeyLen = 40
			tg.Checks = []string{"malformed-key"}
			report := check(t, tg)
			assert.Equal(t, idemtest.StatusPass, report.Results[0].Status, report.Results[0].Detail)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, seen, 5, "every probe reached the handler")
			assert.Equal(t, "", seen[0])
			valid := 36
			if form == idemtest.KeyQuoted {
				valid = 38
			}
			for i, want := range []string{"\t", "é", `"`} {
				assert.Contains(t, seen[i+1], want)
				assert.Len(t, seen[i+1], valid, "probe %d is as long as a valid key", i+1)
			}
			assert.Len(t, strings.Trim(seen[4], `"`), 41, "one byte over the limit")
			sent := report.Results[0].Sent
			assert.Contains(t, sent, `\t`, "the tab is shown escaped")
			assert.Contains(t, sent, "(41 bytes, one over the limit of 40")
		})
	}
}

// plainKey reports whether key is 1 or more bytes of printable ASCII
// without a space or a quote.
func plainKey(key string) bool {
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c > '~' || c == '"' {
			return false
		}
	}
	return key != ""
}

// TestQuotedKeys: keys sent as Structured Field strings, as the draft
// writes them, are keys to our server like bare ones.
func TestQuotedKeys(t *testing.T) {
	var mu sync.Mutex
	keys := map[string]bool{}
	h := &orders{}
	seen := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys[r.Header.Get("Idempotency-Key")] = true
		mu.Unlock()
		h.ServeHTTP(w, r)
	})
	srv := start(t, protect(t, seen))
	tg := target(srv.URL)
	tg.KeyForm = idemtest.KeyQuoted
	report := check(t, tg)
	for _, res := range report.Results {
		want := idemtest.StatusPass
		if res.Name == "key-forms" {
			want = idemtest.StatusNotApplicable
		}
		assert.Equal(t, want, res.Status, "%s: %s", res.Name, res.Detail)
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, keys)
	for key := range keys {
		assert.Regexp(t, `^"[0-9A-Za-z_-]+"$`, key)
	}
	assert.Equal(t, idemtest.KeyQuoted, report.Policy.KeyForm)
}

// TestAnswersShownOneWay: bodies are shown between backquotes, with escapes,
// whatever their last byte; long bodies and header values are cut short.
func TestAnswersShownOneWay(t *testing.T) {
	for _, tc := range []struct {
		body, location, want string
	}{
		{`{"order":1}`, "/orders/1", "Location: /orders/1, body `{\"order\":1}`"},
		{"{\"order\":1}\n", "/orders/1", "body `{\"order\":1}\\n`"},
		{" padded ", "/orders/1", "body ` padded `"},
		{"\x00\xff", "/orders/1", "body `\\x00\\xff`"},
		{strings.Repeat("a", 200), "/" + strings.Repeat("b", 300), "Location: /" + strings.Repeat("b", 159) + "... (301 bytes), body `" + strings.Repeat("a", 160) + "`... (200 bytes)"},
	} {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", tc.location)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, tc.body)
		})
		tg := target("")
		tg.Handler = h
		tg.Checks = []string{"first-request"}
		res := check(t, tg).Results[0]
		assert.Contains(t, res.Got, tc.want)
	}
}
