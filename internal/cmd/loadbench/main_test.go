package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

// envLoadgen makes the test binary a load generator, as -loadgen makes the
// program one.
const envLoadgen = "LOADBENCH_TEST_LOADGEN"

// envServer makes the test binary a server program that prints the
// variable's value, or, empty, exits at once with a message.
const envServer = "LOADBENCH_TEST_SERVER"

func TestMain(m *testing.M) {
	if line, ok := os.LookupEnv(envServer); ok {
		if line == "" {
			os.Stderr.WriteString("cannot serve\n")
			os.Exit(3)
		}
		os.Stdout.WriteString(line + "\n")
		time.Sleep(time.Hour) // until killed
		os.Exit(0)
	}
	if os.Getenv(envLoadgen) == "1" {
		if err := serveJobs(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func testLoadgen() (*loadgen, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envLoadgen+"=1")
	return startLoadgenCmd(cmd)
}

func TestParseInts(t *testing.T) {
	for _, tc := range []struct {
		in    string
		least int
		want  []int
		err   bool
	}{
		{"1,8,32,128", 1, []int{1, 8, 32, 128}, false},
		{"0, 10_000,1_000_000", 0, []int{0, 10000, 1000000}, false},
		{"0", 1, nil, true},
		{"", 0, nil, true},
		{"1,x", 1, nil, true},
	} {
		got, err := parseInts(tc.in, tc.least)
		if (err != nil) != tc.err || !equalInts(got, tc.want) {
			t.Errorf("parseInts(%q, %d) = %v, %v; want %v, error %v", tc.in, tc.least, got, err, tc.want, tc.err)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseStores(t *testing.T) {
	got, err := parseStores("redis, memory,redis")
	if err != nil || strings.Join(got, ",") != "redis,memory" {
		t.Errorf(`parseStores("redis, memory,redis") = %v, %v; want [redis memory]`, got, err)
	}
	if _, err := parseStores("mongo"); err == nil {
		t.Error(`parseStores("mongo"): no error`)
	}
}

func TestHistogram(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	s := h.take()
	if s.n != 1000 || s.max != time.Millisecond {
		t.Fatalf("take() = %d values, max %v; want 1000, 1ms", s.n, s.max)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 500 * time.Microsecond}, {99, 990 * time.Microsecond}, {100, time.Millisecond}} {
		got := s.percentile(tc.p)
		if diff := got - tc.want; diff < -tc.want/16 || diff > tc.want/16 {
			t.Errorf("percentile(%v) = %v, want %v within 1/16", tc.p, got, tc.want)
		}
	}
	if again := h.take(); again.n != 0 || again.max != 0 {
		t.Errorf("take() after take() = %d values, max %v; want none", again.n, again.max)
	}
}

func TestBuckets(t *testing.T) {
	prev := -1
	for ns := int64(0); ns < 1<<20; ns += 1 + ns/64 {
		b := bucketOf(ns)
		if b < prev {
			t.Fatalf("bucketOf(%d) = %d, below the bucket of a smaller value, %d", ns, b, prev)
		}
		prev = b
		if mid := bucketMid(b); mid < ns-ns/16 || mid > ns+ns/16 {
			t.Fatalf("bucketMid(bucketOf(%d)) = %d, more than 1/16 away", ns, mid)
		}
	}
	if b := bucketOf(1<<63 - 1); b >= len(histogram{}.counts) {
		t.Errorf("bucketOf(max int64) = %d, out of %d buckets", b, len(histogram{}.counts))
	}
}

// The wire counts each Write as a round trip, and the bytes both ways.
func TestWire(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	w := &wire{}
	c, err := w.dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 5)
	for range 3 {
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.read(); got.writes != 3 || got.bytes != 30 {
		t.Errorf("wire = %d writes, %d bytes; want 3, 30", got.writes, got.bytes)
	}
}

// The load generator answers a job with what it sent, and a job without a
// duration runs until it is stopped.
func TestLoadgen(t *testing.T) {
	var keys = make(chan string, 1<<16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case keys <- r.Header.Get("Idempotency-Key"):
		default:
		}
		handler(w, r)
	}))
	defer srv.Close()
	gen, err := testLoadgen()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := gen.close(); err != nil {
			t.Errorf("load generator: %v", err)
		}
	}()
	res, err := gen.run(job{URL: srv.URL, Concurrency: 2, Seconds: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 || res.ok() != res.Requests || res.Keys != res.Requests {
		t.Errorf("run = %d requests, %d ok, %d keys; want some, all ok, a key each", res.Requests, res.ok(), res.Keys)
	}
	if k := <-keys; !strings.HasPrefix(k, res.KeyPrefix+"-") {
		t.Errorf("key %q, want the prefix %q", k, res.KeyPrefix)
	}
	// Forget the first run's keys: the next to come is the started job's.
	for len(keys) > 0 {
		<-keys
	}
	stop, err := gen.start(srv.URL, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for requests to come, then stop.
	select {
	case <-keys:
	case <-time.After(10 * time.Second):
		t.Fatal("no request from a started job")
	}
	res, err = stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests == 0 {
		t.Errorf("stopped job: %d requests, want some", res.Requests)
	}
}

// A short run on each store measures every phase, and counts the round
// trips the stores should take: two for a first execution, one for a
// replay.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		store string
		needs func(t *testing.T)
	}{
		{benchreport.Memory, func(*testing.T) {}},
		{benchreport.Postgres, func(t *testing.T) { servicetest.PostgresURL(t) }},
		{benchreport.Redis, func(t *testing.T) {
			if _, err := exec.LookPath("redis-server"); err != nil {
				servicetest.Unavailable(t, "redis-server", err)
			}
		}},
	} {
		t.Run(tc.store, func(t *testing.T) {
			tc.needs(t)
			testRun(t, tc.store)
		})
	}
}

func testRun(t *testing.T, store string) {
	cfg := config{
		stores:      []string{store},
		concurrency: []int{2},
		records:     []int{0, 200},
		duration:    150 * time.Millisecond,
		rounds:      1,
		pool:        2,
		sweep:       2000,
		sweepC:      2,
		sweepBatch:  500,
		sweepStall:  500 * time.Millisecond,
		sweepMax:    2 * time.Second,
	}
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out, testLoadgen)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, n := range cfg.records {
		if p := rep.Find(n, 2, benchreport.Bare, benchreport.KindBare); p == nil || p.Median.OK == 0 {
			t.Errorf("bare, %d records: %+v, want requests answered", n, p)
		}
		for _, kind := range []string{benchreport.KindFirst, benchreport.KindReplay} {
			p := rep.Find(n, 2, store, kind)
			if p == nil {
				t.Errorf("%s, %d records: missing", kind, n)
				continue
			}
			m := p.Median
			if m.OK == 0 || m.Other != 0 || m.ServerCPUOverBare == nil {
				t.Errorf("%s, %d records: %d ok, %d other, over bare %v; want all ok, compared with bare", kind, n, m.OK, m.Other, m.ServerCPUOverBare)
			}
			if store == benchreport.Memory {
				if m.RoundTrips != nil || m.StoreCPU != nil {
					t.Errorf("%s: %v round trips, store CPU %v; want neither", kind, *m.RoundTrips, m.StoreCPU)
				}
				continue
			}
			// A first execution: the claim and the completion (on
			// PostgreSQL a few claims after the replays read the key
			// first, a round trip more each). A replay: one read.
			want := 2.0
			if kind == benchreport.KindReplay {
				want = 1
			}
			if m.RoundTrips == nil || *m.RoundTrips < want || *m.RoundTrips > want*1.1 {
				got := "none"
				if m.RoundTrips != nil {
					got = strconv.FormatFloat(*m.RoundTrips, 'f', 3, 64)
				}
				t.Errorf("%s, %d records: %s round trips, want %v (within 10%%)", kind, n, got, want)
			}
			if m.StoreCPU == nil || *m.StoreCPU <= 0 {
				t.Errorf("%s, %d records: store CPU %v, want some", kind, n, m.StoreCPU)
			}
		}
	}
	if store != benchreport.Redis { // Redis: too few records to weigh
		if len(rep.Sizes) != 1 || rep.Sizes[0].Records != 200 || len(rep.Sizes[0].Items) == 0 {
			t.Errorf("sizes = %+v, want the cost of a record at 200 records", rep.Sizes)
		}
	}
	if len(rep.Sweeps) != 1 {
		t.Fatalf("%d sweep runs, want 1", len(rep.Sweeps))
	}
	s := rep.Sweeps[0]
	// Redis expires keys slowly when they are few among those with a time
	// to live: it may not reach 99% while the load adds keys.
	// Its removals are counted with DBSIZE, which also drops when a key
	// the load wrote meanwhile goes (a released claim's tombstone that
	// expires): allow a hundredth more.
	least, most := cfg.sweep*99/100, cfg.sweep
	if store == benchreport.Redis {
		least, most = 1, cfg.sweep+cfg.sweep/100
	}
	if s.Removed < least || s.Removed > most || len(s.Windows) != 3 {
		t.Fatalf("sweep: removed %d in %d windows, want %d to %d in 3", s.Removed, len(s.Windows), least, most)
	}
	for _, i := range []int{0, 2} { // during may be too short for a claim
		if w := s.Windows[i]; w.Claims == 0 || w.ClaimP99 <= 0 {
			t.Errorf("sweep, window %s: %d claims, p99 %v µs; want some", w.Name, w.Claims, w.ClaimP99)
		}
	}
}

// A run that cannot start returns why, rather than panicking on the report
// it has not made.
func TestRunCannotStart(t *testing.T) {
	cfg := config{stores: []string{benchreport.Memory}, concurrency: []int{1}, records: []int{0}, duration: time.Millisecond, rounds: 1, pool: 1}
	noGen := errors.New("no load generator")
	if _, err := run(context.Background(), cfg, io.Discard, func() (*loadgen, error) { return nil, noGen }); !errors.Is(err, noGen) {
		t.Errorf("run = %v, want %v", err, noGen)
	}
}
