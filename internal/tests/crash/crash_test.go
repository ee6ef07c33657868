package crash_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/internal/testkit/testproc"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/internal/wire"
)

var long = flag.Bool("crash.long", false, "run the long crash runs (thousands of orders, dozens of crashes), for the figures")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// size is the size of one run.
type size struct {
	orders, workers, crashes int
	// inflight is how many orders must be in flight (claimed, or being
	// handled, or being stored) when the process is killed.
	inflight int
}

func runSize() size {
	if *long {
		return size{orders: 3000, workers: 16, crashes: 30, inflight: 8}
	}
	return size{orders: 240, workers: 16, crashes: 3, inflight: 8}
}

// TestCrash kills the orders API with SIGKILL while orders are in flight,
// again and again, restarts it on the same store, and checks what the
// database holds once a retrying client has had an answer for every order.
//
// In transactional mode (pg-tx) no order runs twice and none is half done:
// a killed handler's writes roll back with its claim. In lease mode
// (pg-lease, redis-lease) no order is half done either, because the handler
// writes in a transaction of its own, but an order whose transaction had
// committed when the process died, before its response was stored, runs
// again once its lease has expired: the test counts those, and checks that
// there are no more of them than orders were in flight at the kills.
//
// Under RefuseAbandoned no order runs twice, also with a TTL as short as
// the lease (a TTL under the default lease makes the lease the TTL): the
// record of a killed holder outlives its lease by the TTL, so the retry
// sees the takeover. Nor with a handler that, taking an order over, looks
// for the order the killed holder may have written, after answering 503
// once (-takeover fail-once): the 503 releases the key, and the run after it
// must still be told of the killed holder, or it writes the order again.
func TestCrash(t *testing.T) {
	bin := testproc.Build(t, "github.com/idemkit/idempotency/internal/tests/crash/crashserver")
	type mode struct {
		name, kind string
		args       []string // more flags of crashserver
		refuse     bool     // -abandoned refuse
		// once: no order may run twice (-abandoned refuse, or a
		// takeover that looks for its order).
		once bool
		// ttl is the middleware's TTL when it is shorter than the run:
		// the records of orders answered longer ago may have expired.
		ttl time.Duration
		// seen: every run of an order after its first was told, by
		// Lease.Abandoned, of the killed holder before it.
		seen bool
	}
	ttlRun := func(kind string, ttl time.Duration) mode {
		return mode{name: kind + ", refuse, TTL " + ttl.String() + " (the lease)", kind: kind,
			args:   []string{"-abandoned", "refuse", "-ttl", ttl.String(), "-lease", "0"},
			refuse: true, once: true, ttl: ttl}
	}
	failOnce := func(kind string) mode {
		return mode{name: kind + ", a takeover answers 503 once, then looks for its order", kind: kind,
			args: []string{"-takeover", "fail-once"}, once: true}
	}
	modes := []mode{
		{name: "pg-tx", kind: "pg-tx", once: true}, {name: "pg-lease", kind: "pg-lease"}, {name: "redis-lease", kind: "redis-lease"},
		{name: "pg-lease, refuse", kind: "pg-lease", args: []string{"-abandoned", "refuse"}, refuse: true, once: true},
		// The records in an SQLite file that the restarted process opens
		// again; in MySQL.
		{name: "sqlite-lease", kind: "sqlite-lease", seen: true},
		{name: "sqlite-lease, refuse", kind: "sqlite-lease", args: []string{"-abandoned", "refuse"}, refuse: true, once: true},
		{name: "mysql-lease", kind: "mysql-lease", seen: true},
	}
	if *long {
		// The window between the handler's commit and its stored
		// response decides how often a crash lands in it.
		modes = append(modes, mode{name: "pg-lease, answering at once after the commit", kind: "pg-lease", args: []string{"-after", "0s"}},
			mode{name: "redis-lease, refuse", kind: "redis-lease", args: []string{"-abandoned", "refuse"}, refuse: true, once: true},
			mode{name: "mysql-lease, refuse", kind: "mysql-lease", args: []string{"-abandoned", "refuse"}, refuse: true, once: true})
		// Each kill's orders wait out the 30 s lease before they are
		// taken over, while the others go on.
		modes = append(modes, ttlRun("pg-lease", 30*time.Second), ttlRun("redis-lease", 30*time.Second),
			failOnce("pg-lease"), failOnce("redis-lease"))
	} else {
		modes = append(modes, ttlRun("pg-lease", 5*time.Second), failOnce("pg-lease"))
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			kind := m.kind
			if m.refuse {
				requireAbandonedReported(t, kind)
			}
			r := newCrashRun(t, bin, kind, runSize())
			r.args = append(r.args, m.args...)
			r.ttl = m.ttl
			res := r.run(t)
			t.Logf("%s: %d orders, %d crashes (orders in flight at the kills: %v); %d executions, %d orders run twice or more (%d extra executions), %d half done, %d answered but absent, %d answered \"outcome unknown\" (%d of them executed); %d replayed in the audit (%d left out, answered longer ago than half the TTL); answers seen: %s",
				m.name, res.orders, len(res.killedInflight), res.killedInflight, res.executions, res.duplicatedOrders,
				res.extraExecutions, res.halfDone, res.lost, res.unknown, res.unknownExecuted, res.audited, res.orders-res.audited, r.answers)
			assert.Zero(t, res.halfDone, "orders half done")
			assert.Zero(t, res.lost, "orders answered whose order is not in the database")
			assert.Zero(t, res.missing, "orders never executed")
			if m.once {
				assert.Zero(t, res.extraExecutions, "extra executions (orders run twice: %v)", res.duplicated)
			}
			if !m.refuse {
				assert.Zero(t, res.unknown, "\"outcome unknown\" answers without the refuse policy")
			}
			if m.seen {
				assert.Zero(t, res.rerunsUnseen, "runs after an order's first not told of the killed holder (Lease.Abandoned 0)")
				t.Logf("%s: %d reruns, each with Lease.Abandoned > 0", m.name, res.extraExecutions)
			}
			assert.LessOrEqual(t, res.extraExecutions, sum(res.killedInflight),
				"more orders ran twice than were in flight at the kills")
		})
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// crashRun is one run: a store, the orders tables, the server process.
type crashRun struct {
	bin, kind, addr string
	args            []string
	size            size
	ttl             time.Duration // the middleware's, if shorter than the run
	pool            *pgxpool.Pool
	name            string // of the orders' table, the prefix of the others'
	orders          string // sanitized table names
	lines           string
	answers         *answerCount
}

func newCrashRun(t *testing.T, bin, kind string, sz size) *crashRun {
	pool := teststores.PostgresPool(t, 8)
	ctx := context.Background()
	name := teststores.UniqueName(t, "crash_orders_")
	orders, lines := pgx.Identifier{name}.Sanitize(), pgx.Identifier{name + "_lines"}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id bigserial PRIMARY KEY, ref text NOT NULL, lines int NOT NULL, abandoned int NOT NULL DEFAULT 0);"+
		"CREATE TABLE "+lines+" (order_id bigint NOT NULL, n int NOT NULL)")
	require.NoError(t, err)
	var records string
	switch kind {
	case "redis-lease":
		records = teststores.UniqueName(t, "idempotency-crash:") + ":"
		// A store on the prefix, only so that its keys are deleted when
		// the test ends.
		teststores.RedisOn(t, teststores.RedisClient(t), records)
	case "sqlite-lease":
		records = filepath.Join(t.TempDir(), "records.db")
	case "mysql-lease":
		records = teststores.UniqueName(t, "idempotency_crash_")
		// A store on the table, only so that it is dropped when the
		// test ends.
		teststores.MySQLOn(t, teststores.MySQLDB(t, false), records)
	default:
		records = teststores.UniqueName(t, "idempotency_crash_")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Exec(ctx, "DROP TABLE IF EXISTS "+orders+", "+lines+", "+pgx.Identifier{records}.Sanitize())
	})
	return &crashRun{
		bin: bin, kind: kind, addr: freeAddr(t), size: sz, pool: pool, name: name, orders: orders, lines: lines,
		args:    []string{"-store", kind, "-records", records, "-orders", name, "-lease", "1s"},
		answers: &answerCount{},
	}
}

// freeAddr returns a loopback address that was free: the server is started
// on it again after each crash, so that the client's URL stays the same.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func (r *crashRun) start(t *testing.T) *testproc.Process {
	return testproc.Start(t, r.bin, append([]string{"-addr", r.addr}, r.args...))
}

// result is what the database holds after a run.
type result struct {
	orders           int
	killedInflight   []int
	executions       int
	duplicatedOrders int      // orders executed more than once
	duplicated       []string // their refs, for the log
	extraExecutions  int      // executions beyond one per order
	halfDone         int
	lost             int // answered with an order that is not in the database
	missing          int // never executed
	unknown          int // answered "outcome unknown" (the refuse policy)
	unknownExecuted  int // of those, the orders the database holds
	audited          int // orders sent again at the end, each a replay
	rerunsUnseen     int // runs after an order's first whose Lease.Abandoned was 0
}

// run runs the orders, the kills and the final pass, and counts the orders
// in the database.
func (r *crashRun) run(t *testing.T) result {
	res, answers := r.exercise(t)
	r.count(t, &res, answers)
	return res
}

// exercise sends the orders while it kills and restarts the server, then
// sends every order once more, checking that each is a replay of the
// answer the client got. It returns the run's counts so far (orders,
// in flight at the kills, audited) and every order's answer.
func (r *crashRun) exercise(t *testing.T) (result, map[int]string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	proc := r.start(t)
	tr := &http.Transport{MaxIdleConnsPerHost: r.size.workers}
	defer tr.CloseIdleConnections()
	client := clienttest.New(t,
		idempotency.WithHTTPClient(&http.Client{Transport: &countingTransport{next: tr, count: r.answers}}),
		idempotency.WithAttemptTimeout(10*time.Second),
		idempotency.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		idempotency.WithMaxAttempts(20),
		idempotency.WithMaxRetryAfter(2*time.Second),
		idempotency.WithBudget(nil),
	)
	url := "http://" + r.addr + "/orders"
	var (
		mu         sync.Mutex
		answers    = map[int]string{}
		answeredAt = map[int]time.Time{}
		done       atomic.Int64
		crashed    atomic.Bool
	)
	// Orders are sent until the last crash is over, and at least
	// r.size.orders of them: there are orders in flight to crash into
	// however fast the others go.
	refs := make(chan int)
	wg.Go(func() {
		defer close(refs)
		for i := 0; i < r.size.orders || !crashed.Load(); i++ {
			select {
			case refs <- i:
			case <-ctx.Done():
				return
			}
		}
	})
	failures := make(chan error, 1)
	hc := client.StandardClient()
	// A minute for an order, and, with a lease as long as the TTL, time
	// for it to wait out the leases of a few kills in a row.
	patience := time.Minute + 4*r.ttl
	var workers sync.WaitGroup
	for range r.size.workers {
		workers.Go(func() {
			for i := range refs {
				body, err := submit(ctx, hc, url, i, patience)
				if err != nil {
					select {
					case failures <- fmt.Errorf("order %d: %w", i, err):
					default:
					}
					continue
				}
				mu.Lock()
				answers[i] = body
				answeredAt[i] = time.Now()
				mu.Unlock()
				done.Add(1)
			}
		})
	}
	finished := make(chan struct{})
	wg.Go(func() {
		workers.Wait()
		close(finished)
	})

	var (
		res  result
		logs strings.Builder
	)
	for c := 1; c <= r.size.crashes; c++ {
		// Spread the crashes over the run, each while orders are in
		// flight.
		want := int64(c * r.size.orders / (r.size.crashes + 1))
		n := waitUntil(t, proc, func(inflight int) bool {
			return done.Load() >= want && inflight >= r.size.inflight
		}, failures)
		proc.Kill()
		res.killedInflight = append(res.killedInflight, n)
		logs.WriteString(proc.Output())
		proc = r.start(t)
	}
	crashed.Store(true)
	<-finished
	select {
	case err := <-failures:
		t.Fatalf("%v\nserver output:\n%s", err, proc.Output())
	default:
	}
	res.orders = len(answers)
	logs.WriteString(proc.Output())
	t.Logf("what the server processes said:\n%s", logs.String())

	// Every order once more: each is a replay of the answer the client got;
	// with a TTL shorter than the run, every order whose record surely
	// lives (answered within half the TTL), for a record that expired is a
	// new key, and runs again.
	plain := &http.Transport{}
	defer plain.CloseIdleConnections()
	for i := range res.orders {
		want, ok := answers[i]
		require.True(t, ok, "order %d has no answer", i)
		if r.ttl > 0 && time.Since(answeredAt[i]) > r.ttl/2 {
			continue
		}
		res.audited++
		got, replayed, err := send(ctx, &http.Client{Transport: plain}, url, i)
		require.NoError(t, err)
		require.True(t, replayed, "order %d sent again was not a replay: %s", i, got)
		require.Equal(t, want, got, "order %d: the replay differs from the answer the client got", i)
	}
	return res, answers
}

// waitUntil polls the server's count of orders in flight until ready says
// so, and returns the count. It fails t after a minute, or on a failed order.
func waitUntil(t *testing.T, proc *testproc.Process, ready func(inflight int) bool, failures <-chan error) int {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	last := -1
	for {
		select {
		case err := <-failures:
			t.Fatalf("%v\nserver output:\n%s", err, proc.Output())
		case <-tick.C:
		}
		if resp, err := c.Get("http://" + proc.Addr + "/inflight"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if n, err := strconv.Atoi(string(b)); err == nil {
				if ready(n) {
					return n
				}
				last = n
			}
		}
		require.True(t, time.Now().Before(deadline), "the server never had the orders in flight that the crash needs (last seen %d)\n%s", last, proc.Output())
	}
}

// submit sends order i until it gets its 201, for at most patience: the
// client's own retries, and then its caller's, as an application would.
func submit(ctx context.Context, hc *http.Client, url string, i int, patience time.Duration) (string, error) {
	deadline := time.Now().Add(patience)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		body, _, err := send(ctx, hc, url, i)
		if err == nil {
			return body, nil
		}
		last = err
	}
	return "", fmt.Errorf("no answer within %v: %w", patience, last)
}

func send(ctx context.Context, hc *http.Client, url string, i int) (body string, replayed bool, err error) {
	ref := "ref-" + strconv.Itoa(i)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url,
		strings.NewReader(fmt.Sprintf(`{"ref":%q,"lines":%d}`, ref, 1+i%4)))
	if err != nil {
		return "", false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "key-"+ref)
	resp, err := hc.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", false, err
	}
	if resp.StatusCode != http.StatusCreated && !outcomeUnknown(resp.StatusCode, b) {
		return "", false, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return string(b), resp.Header.Get("Idempotent-Replayed") == "true", nil
}

// count reads the orders from the database.
func (r *crashRun) count(t *testing.T, res *result, answers map[int]string) {
	ctx := context.Background()
	rows, err := r.pool.Query(ctx, "SELECT o.id, o.ref, o.lines, o.abandoned, (SELECT count(*) FROM "+r.lines+" l WHERE l.order_id = o.id) FROM "+r.orders+" o ORDER BY o.id")
	require.NoError(t, err)
	perRef := map[string]int{}
	exists := map[string]bool{} // id/ref
	for rows.Next() {
		var (
			id                      int64
			ref                     string
			lines, abandoned, wrote int
		)
		require.NoError(t, rows.Scan(&id, &ref, &lines, &abandoned, &wrote))
		res.executions++
		if perRef[ref] > 0 && abandoned == 0 {
			res.rerunsUnseen++
		}
		perRef[ref]++
		exists[fmt.Sprintf(`{"id":%d,"ref":%q}`, id, ref)] = true
		if wrote != lines {
			res.halfDone++
		}
	}
	require.NoError(t, rows.Err())
	for i, a := range answers {
		n := perRef["ref-"+strconv.Itoa(i)]
		if outcomeUnknown(http.StatusConflict, []byte(a)) {
			// The order ran at most once, and no one was told which.
			res.unknown++
			res.unknownExecuted += min(n, 1)
			if n > 1 {
				res.duplicatedOrders++
				res.extraExecutions += n - 1
			}
			continue
		}
		switch {
		case n == 0:
			res.missing++
		case n > 1:
			res.duplicatedOrders++
			res.extraExecutions += n - 1
			res.duplicated = append(res.duplicated, "ref-"+strconv.Itoa(i))
		}
		if !exists[a] {
			res.lost++
		}
	}
}

// outcomeUnknown reports whether an answer is the final "outcome unknown"
// problem of the refuse policy.
func outcomeUnknown(status int, body []byte) bool {
	return status == http.StatusConflict && strings.Contains(string(body), wire.TypeOutcomeUnknown)
}

// requireAbandonedReported skips the test when the store of kind does not
// report, in Claim.Abandoned, a takeover of an expired lease: the refuse
// policy cannot see takeovers without it.
func requireAbandonedReported(t *testing.T, kind string) {
	t.Helper()
	var store engine.Store
	switch kind {
	case "redis-lease":
		store = teststores.Redis(t)
	case "sqlite-lease":
		store = teststores.SQLite(t)
	case "mysql-lease":
		store = teststores.MySQL(t)
	default:
		store = teststores.Postgres(t)
	}
	ctx := context.Background()
	id := engine.ID{Key: "probe"}
	c, err := store.Claim(ctx, id, "fp", 10*time.Millisecond, time.Minute)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err = store.Claim(ctx, id, "fp", 10*time.Millisecond, time.Minute)
		require.NoError(t, err)
		if c.Status == engine.Acquired {
			if c.Abandoned == 0 {
				t.Skipf("%s does not report Claim.Abandoned on a takeover: the refuse policy needs it", kind)
			}
			return
		}
		require.True(t, time.Now().Before(deadline), "the probe's lease never expired")
		time.Sleep(5 * time.Millisecond)
	}
}

// answerCount counts what the client saw on each attempt.
type answerCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *answerCount) add(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[what]++
}

func (c *answerCount) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for k, v := range c.n {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// countingTransport counts every attempt's outcome: its status, or the kind
// of error that ended it.
type countingTransport struct {
	next  http.RoundTripper
	count *answerCount
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	switch {
	case err == nil:
		c.count.add(strconv.Itoa(resp.StatusCode))
	case errors.Is(err, syscall.ECONNREFUSED):
		c.count.add("refused")
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		c.count.add("cut")
	default:
		c.count.add("error")
	}
	return resp, err
}
