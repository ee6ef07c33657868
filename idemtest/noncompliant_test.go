package idemtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idempotency/idemtest"
	"github.com/idemkit/idempotency/server"
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
// protocol in a known way, and asserts that it names the checks they fail.
func TestNoncompliantServers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(t *testing.T) http.Handler
		// mustFail must all fail; with exact, nothing else may.
		mustFail []string
		exact    bool
	}{
		{
			name:    "check-then-insert",
			handler: func(*testing.T) http.Handler { return newCheckThenInsert(50 * time.Millisecond) },
			// It also compares no fingerprints, scopes no keys and
			// validates none.
			mustFail: []string{idemtest.CheckConcurrent, idemtest.CheckKeyMismatch, idemtest.CheckCrossTenant, idemtest.CheckMalformedKey},
		},
		{
			name:    "ignores the key",
			handler: func(*testing.T) http.Handler { return &orders{} },
			// Even cross-tenant: the first caller's repeat runs again.
			mustFail: []string{idemtest.CheckReplay, idemtest.CheckKeyMismatch, idemtest.CheckMissingKey,
				idemtest.CheckMalformedKey, idemtest.CheckConcurrent, idemtest.CheckDroppedResponse, idemtest.CheckCrossTenant},
			exact: true,
		},
		{
			name: "replays across tenants",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithScope(func(*http.Request) (string, error) { return "everyone", nil }))
			},
			mustFail: []string{idemtest.CheckCrossTenant},
			exact:    true,
		},
		{
			name: "caches 5xx",
			handler: func(t *testing.T) http.Handler {
				return protect(t, &orders{}, server.WithStoreStatus(func(int) bool { return true }))
			},
			mustFail: []string{idemtest.Check5xxNotCached},
			exact:    true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t, tc.handler(t))
			report := check(t, target(srv.URL))
			var failed []string
			for _, res := range report.Failed() {
				failed = append(failed, res.Name)
			}
			err := report.Err()
			if !assert.Error(t, err) {
				return
			}
			for _, name := range tc.mustFail {
				assert.Contains(t, failed, name)
				assert.Contains(t, err.Error(), "\n"+name+": ", "the error names %s", name)
			}
			if tc.exact {
				slices.Sort(failed)
				want := slices.Sorted(slices.Values(tc.mustFail))
				assert.Equal(t, want, failed, "failed checks")
			}
			if t.Failed() {
				b, _ := json.MarshalIndent(report, "", "  ")
				t.Logf("report:\n%s", b)
			}
		})
	}
}

// TestCheckThenInsertRace isolates the concurrent check against the seed's
// handler, with a race window that only the race itself ends.
func TestCheckThenInsertRace(t *testing.T) {
	h := newCheckThenInsert(time.Minute)
	srv := start(t, h)
	tg := target(srv.URL)
	tg.Checks = []string{idemtest.CheckConcurrent}
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
	tg.Checks = []string{idemtest.CheckFirstRequest, idemtest.CheckReplay, idemtest.CheckConcurrent}
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
// the kit passes it, and says what it could not tell.
func TestIndistinguishableExecutions(t *testing.T) {
	h := newCheckThenInsert(100 * time.Millisecond)
	h.static = true
	tg := target("")
	tg.Handler = h
	tg.Checks = []string{idemtest.CheckFirstRequest, idemtest.CheckReplay, idemtest.CheckConcurrent}
	report := check(t, tg)
	for _, res := range report.Results {
		assert.Equal(t, idemtest.StatusPass, res.Status, "%s: %s", res.Name, res.Detail)
	}
	assert.Contains(t, report.Results[1].Detail, "a replay cannot be told from a second execution")
	assert.Contains(t, report.Results[2].Detail, "which the kit could not see")
	assert.GreaterOrEqual(t, h.created.Load(), int64(4), "it did run the concurrent requests more than once")
}
