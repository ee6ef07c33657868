package crash_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/testproc"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestDownstreamCrash is TestCrash in lease mode where the order's effect
// lives in a second service: the killed server's handler sends the order,
// through an idempotency.Client, to an orders service behind the middleware
// of its own (in the test's process, which is not killed), which writes it.
// A kill between the downstream write and the killed server's stored
// response leaves the key in flight; once its lease ends, a retry takes it
// over and the handler runs again, and calls the downstream service again.
//
// With the handler's request context, the client derives the downstream key
// from the incoming key, so the second call is answered with the first
// one's replay and no order is written twice. With a new key in each run,
// the same crashes write orders twice: the contrast shows that the crashes
// do land between the two services' writes.
func TestDownstreamCrash(t *testing.T) {
	bin := testproc.Build(t, "github.com/idemkit/idempotency/internal/tests/crash/crashserver")
	for _, m := range []struct {
		name, kind, keys string
	}{
		{"pg-lease, derived keys", "pg-lease", "derived"},
		{"redis-lease, derived keys", "redis-lease", "derived"},
		{"pg-lease, random keys", "pg-lease", "random"},
	} {
		t.Run(m.name, func(t *testing.T) {
			r := newCrashRun(t, bin, m.kind, runSize())
			down := startOrdersService(t, r.orders, r.lines)
			// The pause between the downstream answer and this server's
			// answer is where a kill leaves an effect and no stored
			// response; 100 ms makes most kills land there.
			r.args = append(r.args, "-downstream", down.url, "-downstream-keys", m.keys, "-after", "100ms")
			res := r.run(t)
			t.Logf("downstream orders not written: %q; orders written twice: %v", down.failed(), res.duplicated)
			t.Logf("%s: %d orders, %d crashes (orders in flight at the kills: %v); downstream: %d requests, %d executions, %d replays; %d orders written twice or more (%d extra), %d half done, %d answered but absent; answers seen: %s",
				m.name, res.orders, len(res.killedInflight), res.killedInflight, down.requests.Load(), res.executions,
				down.replays.Load(), res.duplicatedOrders, res.extraExecutions, res.halfDone, res.lost, r.answers)
			assert.Zero(t, res.halfDone, "orders half done")
			assert.Zero(t, res.lost, "orders answered whose order is not in the database")
			assert.Zero(t, res.missing, "orders never executed")
			assert.Zero(t, res.unknown, "\"outcome unknown\" answers without the refuse policy")
			if m.keys == "derived" {
				assert.Zero(t, res.extraExecutions, "orders written twice downstream with derived keys")
				// The final pass sends every order once more to the
				// killed server, which replays it without calling
				// downstream: the replays downstream are the reruns'.
				assert.Positive(t, down.replays.Load(), "no rerun reached the downstream service: the test shows nothing")
			} else {
				assert.Positive(t, res.extraExecutions, "no order written twice with random keys: the crashes missed the window")
			}
			assert.LessOrEqual(t, res.extraExecutions, sum(res.killedInflight),
				"more orders ran twice than were in flight at the kills")
		})
	}
}

// ordersService is the downstream service: the orders API behind the
// middleware, on a memory store, in the test's process, writing into the
// tables orders and lines (sanitized names).
type ordersService struct {
	url                string
	requests, replays  atomic.Int64
	pool               *pgxpool.Pool
	insertOrder, lines string

	mu       sync.Mutex
	failures []string
}

func startOrdersService(t *testing.T, orders, lines string) *ordersService {
	store, err := memstore.New()
	require.NoError(t, err)
	mw, err := server.New(store, server.WithConfig(engine.Config{Lease: 10 * time.Second, TTL: time.Hour}))
	require.NoError(t, err)
	// A pool of its own, as large as the killed server's callers.
	s := &ordersService{pool: teststores.PostgresPool(t, 16),
		insertOrder: "INSERT INTO " + orders + " (ref, lines) VALUES ($1, $2) RETURNING id",
		lines:       "INSERT INTO " + lines + " (order_id, n) VALUES ($1, $2)",
	}
	protected := mw.Handler(http.HandlerFunc(s.write))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.requests.Add(1)
		protected.ServeHTTP(w, req)
		if w.Header().Get("Idempotent-Replayed") == "true" {
			s.replays.Add(1)
		}
	}))
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, mw.Shutdown(ctx))
		assert.NoError(t, store.Close())
	})
	s.url = srv.URL + "/orders"
	return s
}

// fail answers 503 for an order not written, and keeps why.
func (s *ordersService) fail(w http.ResponseWriter, ref, step string, err error) {
	s.mu.Lock()
	s.failures = append(s.failures, fmt.Sprintf("%s (%s): %v", ref, step, err))
	s.mu.Unlock()
	http.Error(w, "order not written", http.StatusServiceUnavailable)
}

// failed returns what fail kept.
func (s *ordersService) failed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.failures)
}

// write writes an order and its lines in one transaction, and answers with
// the order's number.
func (s *ordersService) write(w http.ResponseWriter, req *http.Request) {
	var in struct {
		Ref   string
		Lines int
	}
	if err := json.NewDecoder(req.Body).Decode(&in); err != nil || in.Ref == "" || in.Lines < 0 || in.Lines > 100 {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	ctx := req.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		s.fail(w, in.Ref, "begin", err)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var id int64
	if err := tx.QueryRow(ctx, s.insertOrder, in.Ref, in.Lines).Scan(&id); err != nil {
		s.fail(w, in.Ref, "insert", err)
		return
	}
	for n := range in.Lines {
		if _, err := tx.Exec(ctx, s.lines, id, n); err != nil {
			s.fail(w, in.Ref, "line", err)
			return
		}
	}
	// The caller's disconnect (the killed server) cancels ctx: a commit cut
	// short by it may have been applied all the same, and answered 503, its
	// key released, the order would be written again.
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		s.fail(w, in.Ref, "commit", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"ref":%q}`, id, in.Ref)
}
