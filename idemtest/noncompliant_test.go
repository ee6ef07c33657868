package idemtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/idemtest"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// checkThenInsert is the handler of the seed documents: it looks the key up
// (SELECT), and if it finds nothing it creates the order and then records
// the response (INSERT). Two requests that look before either records both
// find nothing, and both create an order.
type checkThenInsert struct {
	created atomic.Int64
	// window is the longest a request waits, between its look-up and its
	// insert, for another request with its key to look too: the time a
	// real createOrder would take, cut short once the race is certain.
	window time.Duration
	// static makes every order's answer the same, {"status":"accepted"},
	// and marked makes a replay carry Idempotent-Replayed: true.
	static, marked bool

	mu      sync.Mutex
	records map[string]stored
	looked  map[string]*lookers
}

type stored struct {
	status int
	body   string
}

// lookers counts the look-ups for one key; second is closed at the second.
type lookers struct {
	n      int
	second chan struct{}
}

func newCheckThenInsert(window time.Duration) *checkThenInsert {
	return &checkThenInsert{window: window, records: map[string]stored{}, looked: map[string]*lookers{}}
}

func (s *checkThenInsert) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"Idempotency-Key header required"}`)
		return
	}
	body, _ := io.ReadAll(r.Body)

	// SELECT response_body, status_code FROM idempotency_keys WHERE key = $1
	s.mu.Lock()
	rec, found := s.records[key]
	l := s.looked[key]
	if l == nil {
		l = &lookers{second: make(chan struct{})}
		s.looked[key] = l
	}
	if l.n++; l.n == 2 {
		close(l.second)
	}
	s.mu.Unlock()
	if found {
		if s.marked {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.status)
		io.WriteString(w, rec.body)
		return
	}

	// const order = await createOrder(req.body)
	timer := time.NewTimer(s.window)
	select {
	case <-l.second:
	case <-timer.C:
	}
	timer.Stop()
	if r.Header.Get("X-Fail") != "" {
		http.Error(w, "createOrder failed", http.StatusInternalServerError)
		return
	}
	order := fmt.Sprintf(`{"order":%d,"request":%q}`, s.created.Add(1), body)
	if s.static {
		order = `{"status":"accepted"}`
	}

	// INSERT INTO idempotency_keys (key, response_body, status_code) ...
	s.mu.Lock()
	s.records[key] = stored{http.StatusCreated, order}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, order)
}

// TestNoncompliantServers runs the kit against servers that each break the
// protocol, or take a liberty that the draft allows, in a known way, and
// asserts the verdict it must give: the checks that fail (all of them, where
// exact), and the status of others.
func TestNoncompliantServers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(t *testing.T) http.Handler
		edit    func(tg *idemtest.Target)
		// mustFail must all fail; with exact, nothing else may.
		mustFail []string
		exact    bool
		// want are the statuses of other checks.
		want map[string]idemtest.Status
		// detail and note are in the named check's detail, and in the
		// report's notes.
		detail map[string]string
		note   string
	}{
		{
			name:    "check-then-insert",
			handler: func(*testing.T) http.Handler { return newCheckThenInsert(50 * time.Millisecond) },
			// It also compares no fingerprints, scopes no keys and
			// validates none.
			mustFail: []string{"concurrent", "key-mismatch", "cross-tenant", "malformed-key"},
		},
		{
			name:    "ignores the key",
			handler: func(*testing.T) http.Handler { return &orders{} },
			// Even cross-tenant: the first caller's repeat runs again.
			mustFail: []string{"replay", "key-mismatch", "missing-key",
				"malformed-key", "concurrent", "dropped-response", "cross-tenant"},
			exact: true,
			note:  "Every request ran as if it had no key",
		},
		{
			name: "reads the key from another header",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithKeyHeader("X-Idempotency-Key"), server.WithKeyOptional())
			},
			edit: func(tg *idemtest.Target) { tg.KeysOptional = true },
			// Keys being optional, the malformed ones may be ignored.
			mustFail: []string{"replay", "key-mismatch", "concurrent",
				"dropped-response", "cross-tenant"},
			exact: true,
			note:  "X-Idempotency-Key is a common one; Target.KeyHeader, idemcheck -key-header, names it",
		},
		{
			name: "replays across tenants",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithScope(func(*http.Request) (string, error) { return "everyone", nil }))
			},
			mustFail: []string{"cross-tenant"},
			exact:    true,
			detail:   map[string]string{"cross-tenant": "keys are not scoped to the caller"},
		},
		{
			name: "drops Location on replay",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithStoredHeaders("Content-Type"))
			},
			mustFail: []string{"replay"},
			exact:    true,
			want:     map[string]idemtest.Status{"replay-marked": idemtest.StatusPass},
			detail:   map[string]string{"replay": "The replay's headers differ from the first answer's: Location was dropped."},
		},
		{
			name: "stores 5xx, as the draft allows",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithKeep(func(int) bool { return true }))
			},
			exact:  true,
			want:   map[string]idemtest.Status{"5xx-not-cached": idemtest.StatusAdvisory},
			detail: map[string]string{"5xx-not-cached": "The 5xx was stored and replayed: a retry with this key gets the error, never a success. Policy release-5xx, advisory"},
		},
		{
			name: "stores 5xx, release-5xx required",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithKeep(func(int) bool { return true }))
			},
			edit:     func(tg *idemtest.Target) { tg.Require5xxRelease = true },
			mustFail: []string{"5xx-not-cached"},
			exact:    true,
			detail:   map[string]string{"5xx-not-cached": "Policy release-5xx, required"},
		},
		{
			name:     "stuck key after a 5xx",
			handler:  func(t *testing.T) http.Handler { return stuckAfter5xx(protect(t, &orders{})) },
			edit:     func(tg *idemtest.Target) { tg.Patience = 300 * time.Millisecond },
			mustFail: []string{"5xx-not-cached"},
			exact:    true,
			detail:   map[string]string{"5xx-not-cached": "This is a failure whatever the policy"},
		},
		{
			name: "treats an empty key as none, keys optional",
			handler: func(t *testing.T) http.Handler {
				return emptyKeyIsNone(protect(t, &orders{}, server.WithKeyOptional()))
			},
			edit:  func(tg *idemtest.Target) { tg.KeysOptional = true },
			exact: true,
			want: map[string]idemtest.Status{
				"malformed-key": idemtest.StatusPass,
				"missing-key":   idemtest.StatusNotApplicable,
			},
			detail: map[string]string{"malformed-key": "Ignored, as RFC 8941 allows of a field that does not parse (two requests with it both ran, as requests without a key do): the empty key."},
		},
		{
			name: "treats an empty key as none, keys required",
			handler: func(t *testing.T) http.Handler {
				return emptyKeyIsNone(protect(t, &orders{}, server.WithKeyOptional()))
			},
			mustFail: []string{"missing-key", "malformed-key"},
			exact:    true,
			detail:   map[string]string{"malformed-key": "Ran, not refused: the empty key."},
		},
		{
			name: "one request at a time, quickly",
			handler: func(t *testing.T) http.Handler {
				store, err := memstore.New()
				require.NoError(t, err)
				t.Cleanup(func() { store.Close() })
				mw, err := server.New(store)
				require.NoError(t, err)
				return oneAtATime(mw.Handler(&orders{}))
			},
			exact: true,
			want:  map[string]idemtest.Status{"concurrent": idemtest.StatusInconclusive},
			detail: map[string]string{"concurrent": "too fast for duplicates released together to meet the first while it ran. " +
				"They reached the idempotency layer after it had finished, and got its answer, which a server without any protection of requests in flight also gives. " +
				"Point the check at an endpoint that takes 100ms or more to run a request"},
		},
		{
			// Slow, but one request at a time: the duplicates wait, but
			// so does the request under another key, so they never met
			// the first at the idempotency layer.
			name: "one request at a time, slowly",
			handler: func(t *testing.T) http.Handler {
				store, err := memstore.New()
				require.NoError(t, err)
				t.Cleanup(func() { store.Close() })
				mw, err := server.New(store)
				require.NoError(t, err)
				return oneAtATime(mw.Handler(slowly(120*time.Millisecond, &orders{})))
			},
			edit:   func(tg *idemtest.Target) { tg.Checks = []string{"concurrent"} },
			exact:  true,
			want:   map[string]idemtest.Status{"concurrent": idemtest.StatusInconclusive},
			detail: map[string]string{"concurrent": "The target handled the requests one at a time, so the duplicates never met the first at its idempotency layer"},
		},
		{
			name: "marks replays with a common spelling",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithReplayedHeader("X-Idempotent-Replayed"))
			},
			exact:  true,
			want:   map[string]idemtest.Status{"replay-marked": idemtest.StatusPass},
			detail: map[string]string{"replay-marked": "The replay is marked with X-Idempotent-Replayed, not Idempotent-Replayed."},
			note:   "Replays are marked with X-Idempotent-Replayed, not Idempotent-Replayed",
		},
		{
			name: "a key length limit under the declared one",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{})
			},
			edit:  func(tg *idemtest.Target) { tg.MaxKeyLen = 300 },
			exact: true,
			want:  map[string]idemtest.Status{"malformed-key": idemtest.StatusPass},
		},
		{
			name: "a key length limit over the declared one",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{})
			},
			edit:     func(tg *idemtest.Target) { tg.MaxKeyLen = 100 },
			mustFail: []string{"malformed-key"},
			exact:    true,
			detail:   map[string]string{"malformed-key": "Ran, not refused: the 101-byte key."},
		},
		{
			name:    "quoted and bare keys are two keys",
			handler: func(*testing.T) http.Handler { return newCheckThenInsert(0) },
			edit: func(tg *idemtest.Target) {
				tg.KeyForm = idemtest.KeyBoth
				tg.Checks = []string{"first-request", "replay", "key-forms"}
			},
			mustFail: []string{"key-forms"},
			exact:    true,
			detail: map[string]string{"key-forms": "The quoted form after the bare one ran the request again: the two forms are two keys; " +
				"the bare form after the quoted one ran the request again"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t, tc.handler(t))
			tg := target(srv.URL)
			if tc.edit != nil {
				tc.edit(&tg)
			}
			report := check(t, tg)
			var failed []string
			for _, res := range report.Failed() {
				failed = append(failed, res.Name)
			}
			err := report.Err()
			if len(tc.mustFail) > 0 {
				assert.Error(t, err)
			}
			for _, name := range tc.mustFail {
				assert.Contains(t, failed, name)
				if err != nil {
					assert.Contains(t, err.Error(), "\n"+name+": ", "the error names %s", name)
				}
			}
			if tc.exact {
				slices.Sort(failed)
				want := slices.Sorted(slices.Values(tc.mustFail))
				assert.Equal(t, want, failed, "failed checks")
			}
			got := statuses(report)
			for name, want := range tc.want {
				assert.Equal(t, want, got[name], name)
			}
			for name, want := range tc.detail {
				res, _ := report.Result(name)
				assert.Contains(t, res.Detail, want, name)
			}
			if tc.note != "" {
				assert.Contains(t, strings.Join(report.Notes, "\n"), tc.note)
			} else {
				assert.Empty(t, report.Notes)
			}
			if t.Failed() {
				b, _ := json.MarshalIndent(report, "", "  ")
				t.Logf("report:\n%s", b)
			}
		})
	}
}

// stuckAfter5xx answers 409, as for a request in flight, to every request
// whose key once got a 5xx: the flaw of a server that claims a key and, when
// the handler fails, neither stores the failure nor releases the key.
func stuckAfter5xx(h http.Handler) http.Handler {
	var mu sync.Mutex
	stuck := map[string]bool{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		inFlight := stuck[key]
		mu.Unlock()
		if inFlight {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "A request with this key is in progress.", http.StatusConflict)
			return
		}
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.status >= 500 && key != "" {
			mu.Lock()
			stuck[key] = true
			mu.Unlock()
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(status int) {
	s.status = status
	s.ResponseWriter.WriteHeader(status)
}

// emptyKeyIsNone drops an empty key header, as a server that reads the key
// with a lookup that cannot tell empty from absent does.
func emptyKeyIsNone(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if vs := r.Header.Values("Idempotency-Key"); len(vs) == 1 && vs[0] == "" {
			r.Header.Del("Idempotency-Key")
		}
		h.ServeHTTP(w, r)
	})
}

// oneAtATime handles one request at a time, as a server whose handlers end
// before the next request is read does: concurrent requests never overlap.
func oneAtATime(h http.Handler) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// TestCheckThenInsertRace isolates the concurrent check against the seed's
// handler. Its race window is ended by the race itself (the second
// look-up), or after 200ms for the lone requests of the checks that the
// concurrent check runs first.
func TestCheckThenInsertRace(t *testing.T) {
	h := newCheckThenInsert(200 * time.Millisecond)
	srv := start(t, h)
	tg := target(srv.URL)
	tg.Checks = []string{"concurrent"}
	tg.Concurrency = 5
	report := check(t, tg)
	res := report.Results[0]
	assert.Equal(t, idemtest.StatusFail, res.Status)
	assert.Contains(t, res.Detail, "different successful answers: the request ran at least")
	assert.GreaterOrEqual(t, h.created.Load(), int64(2), "orders created")
	assert.Contains(t, report.Err().Error(), "concurrent: ")
}

// TestConcurrentUnmarkedDuplicates: a target whose answers are the same for
// every execution, but which marks its replays, is caught running concurrent
// duplicates: they come back equal, but unmarked.
func TestConcurrentUnmarkedDuplicates(t *testing.T) {
	static := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, `{"status":"accepted"}`)
	})
	tg := target("")
	tg.Checks = []string{"first-request", "replay", "concurrent"}
	tg.Handler = protect(t, static)
	report := check(t, tg)
	for _, res := range report.Results {
		assert.Equal(t, idemtest.StatusPass, res.Status, "%s: %s", res.Name, res.Detail)
	}

	h := newCheckThenInsert(100 * time.Millisecond)
	h.static, h.marked = true, true
	tg.Handler = h
	report = check(t, tg)
	res := report.Results[2]
	assert.Equal(t, idemtest.StatusPass, report.Results[1].Status, "replay")
	assert.Equal(t, idemtest.StatusFail, res.Status, res.Got)
	assert.Contains(t, res.Detail, "not marked as replays, though this target marks its replays")
}

// TestIndistinguishableExecutions: a target that answers every execution
// the same way and marks nothing cannot be caught running a request twice;
// the kit does not fail it, and says what it could not tell.
func TestIndistinguishableExecutions(t *testing.T) {
	h := newCheckThenInsert(100 * time.Millisecond)
	h.static = true
	tg := target("")
	tg.Handler = h
	tg.Checks = []string{"first-request", "replay", "concurrent"}
	report := check(t, tg)
	assert.Equal(t, idemtest.StatusPass, report.Results[0].Status, report.Results[0].Detail)
	assert.Equal(t, idemtest.StatusInconclusive, report.Results[1].Status, report.Results[1].Detail)
	assert.Contains(t, report.Results[1].Detail, "a replay cannot be told from a second execution")
	// The duplicates ran together and quickly: nothing showed them in
	// flight, and nothing told them from replays.
	assert.Equal(t, idemtest.StatusInconclusive, report.Results[2].Status)
	assert.Contains(t, report.Results[2].Detail, "which the kit could not see")
	assert.NoError(t, report.Err())
	assert.GreaterOrEqual(t, h.created.Load(), int64(4), "it did run the concurrent requests more than once")
}

// TestKeyMismatchHint: the hint about white space comes only when the two
// bodies differ only in white space.
func TestKeyMismatchHint(t *testing.T) {
	for _, tc := range []struct {
		body string
		hint bool
	}{
		{`{"sku":"A1","note":"{{variant}}"}`, false},
		{`{"sku":"A1"}`, true},
	} {
		tg := target("")
		tg.Handler = newCheckThenInsert(0)
		tg.Body = idemtest.BodyTemplate(tc.body)
		tg.Checks = []string{"key-mismatch"}
		res := check(t, tg).Results[0]
		assert.Equal(t, idemtest.StatusFail, res.Status, tc.body)
		assert.Equal(t, tc.hint, strings.Contains(res.Detail, "differ only in white space"), "%s: %s", tc.body, res.Detail)
	}
}

// noInFlight is a server without any in-flight protection: it answers a key
// that has a stored answer with that answer, marked as a replay, and runs
// any other request (an order of its own, after delay) and then stores its
// answer. A duplicate that arrives while the first runs runs too; one that
// arrives after gets the replay.
type noInFlight struct {
	delay   time.Duration
	created atomic.Int64

	mu      sync.Mutex
	records map[string]string
}

func newNoInFlight(delay time.Duration) *noInFlight {
	return &noInFlight{delay: delay, records: map[string]string{}}
}

func (s *noInFlight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	stored, found := s.records[key]
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if found && key != "" {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, stored)
		return
	}
	if s.delay > 0 {
		timer := time.NewTimer(s.delay)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
		}
	}
	order := fmt.Sprintf(`{"order":%d,"request":%q}`, s.created.Add(1), body)
	if key != "" {
		s.mu.Lock()
		s.records[key] = order
		s.mu.Unlock()
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, order)
}

// TestConcurrentNeedsInFlightProtection: a server without in-flight
// protection never passes the concurrent check. With a slow endpoint the
// duplicates run during the first and it fails; with a fast one they come
// after the first has finished and get its replay, which shows nothing:
// inconclusive, with what would make it conclusive. It used to pass, every
// time, for the 100 Continue its requests got.
func TestConcurrentNeedsInFlightProtection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		runs  int
	}{
		{"fast", 0, 10},
		{"slow", 150 * time.Millisecond, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newNoInFlight(tc.delay)
			srv := start(t, h)
			tg := target(srv.URL)
			tg.Checks = []string{"concurrent"}
			for i := range tc.runs {
				res, _ := check(t, tg).Result("concurrent")
				if !assert.NotEqual(t, idemtest.StatusPass, res.Status, "run %d: %s\n%s", i, res.Detail, res.Got) {
					continue
				}
				switch res.Status {
				case idemtest.StatusFail:
					assert.Contains(t, res.Detail, "the request ran at least", "run %d", i)
				case idemtest.StatusInconclusive:
					assert.Contains(t, res.Detail, "an endpoint that takes 100ms or more", "run %d: the hint", i)
				default:
					t.Errorf("run %d: %s: %s", i, res.Status, res.Detail)
				}
				if tc.delay > 0 {
					assert.Equal(t, idemtest.StatusFail, res.Status, "run %d: the duplicates ran during the first: %s\n%s", i, res.Detail, res.Got)
				}
			}
		})
	}
}
