//go:build unix

package idempotency_test

import (
	"bytes"
	"context"
	"flag"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
)

var (
	ratioRun      = flag.Bool("client.ratio", false, "measure the cost of a loopback POST through each client, in interleaved rounds (TestPostRatio)")
	ratioRounds   = flag.Int("client.rounds", 31, "rounds of -client.ratio")
	ratioPerRound = flag.Int("client.perround", 2000, "requests per client and round of -client.ratio")
)

// TestPostRatio measures one POST of 1 KiB answered 201 over a keep-alive
// loopback connection through a bare http.Client, this package's Client
// (with and without its attempt timeout) and a stock go-retryablehttp
// client, in one process, on one Transport: the clients take turns in
// rounds, in an order shuffled each round, so that the noise of a shared
// machine falls on all of them alike. Each turn starts with a garbage
// collection and is long enough for several more, so that each client pays
// for its own garbage. It
// reports the median time (wall and CPU) and allocations per request of
// each (allocations of the process: the server's included), and the
// medians of their ratios in each round. The client bare+key is the bare
// one sending a constant key header: it tells what the header costs by
// itself. It asserts nothing about time; it runs only with -client.ratio:
//
//	go test -run '^TestPostRatio$' -client.ratio -count=1 -v .
func TestPostRatio(t *testing.T) {
	if !*ratioRun {
		t.Skip("a measurement: run with -client.ratio")
	}
	payload := bytes.Repeat([]byte("x"), 1024)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	// One Transport for all, so that they take turns on the same
	// keep-alive connection: each connection has a speed of its own.
	tr := srv.Client().Transport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	ctx := context.Background()
	newRequest := func() *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		return req
	}
	finish := func(resp *http.Response, err error) {
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status = %d, want 201", resp.StatusCode)
		}
	}

	hc := &http.Client{Transport: tr}
	hkc := &http.Client{Transport: tr}
	keyValue := []string{idempotency.NewKey()}
	ic := clienttest.New(t, idempotency.WithHTTPClient(&http.Client{Transport: tr}))
	ic0 := clienttest.New(t, idempotency.WithHTTPClient(&http.Client{Transport: tr}), idempotency.WithAttemptTimeout(0))
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.HTTPClient = &http.Client{Transport: tr}
	clients := []struct {
		name string
		post func()
	}{
		{"bare", func() { finish(hc.Do(newRequest())) }},
		// What the key header costs by itself, on the wire and in the
		// server: a bare client that sends one.
		{"bare+key", func() {
			req := newRequest()
			req.Header[hdrKey] = keyValue
			finish(hkc.Do(req))
		}},
		{"idempotency", func() { finish(ic.Do(newRequest())) }},
		{"no-timeout", func() { finish(ic0.Do(newRequest())) }},
		{"retryablehttp", func() {
			req, err := retryablehttp.FromRequest(newRequest())
			if err != nil {
				t.Fatal(err)
			}
			finish(rc.Do(req))
		}},
	}

	const bare, bareKey, ours, noTimeout, rh = 0, 1, 2, 3, 4
	ratios := []struct {
		name string
		a, b int
	}{
		{"idempotency/bare", ours, bare},
		{"retryablehttp/bare", rh, bare},
		{"idempotency/retryablehttp", ours, rh},
		{"bare+key/bare", bareKey, bare},
		{"idempotency/bare+key", ours, bareKey},
		{"no-timeout/bare", noTimeout, bare},
	}

	n := *ratioPerRound
	nsPerOp := make([][]float64, len(clients))
	cpuPerOp := make([][]float64, len(clients))
	allocsPerOp := make([][]float64, len(clients))
	for _, c := range clients {
		for range 100 { // warm up connections and pools
			c.post()
		}
	}
	var ms runtime.MemStats
	order := make([]int, len(clients))
	for i := range order {
		order[i] = i
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range *ratioRounds {
		// A new order each round, so that no client always follows the
		// same one.
		rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			// Each client starts without the garbage of the one before.
			runtime.GC()
			runtime.ReadMemStats(&ms)
			mallocs := ms.Mallocs
			cpu := cpuTime(t)
			start := time.Now()
			for range n {
				clients[i].post()
			}
			elapsed := time.Since(start)
			cpu = cpuTime(t) - cpu
			runtime.ReadMemStats(&ms)
			nsPerOp[i] = append(nsPerOp[i], float64(elapsed.Nanoseconds())/float64(n))
			cpuPerOp[i] = append(cpuPerOp[i], float64(cpu.Nanoseconds())/float64(n))
			allocsPerOp[i] = append(allocsPerOp[i], float64(ms.Mallocs-mallocs)/float64(n))
		}
	}

	for i, c := range clients {
		t.Logf("%-14s %8.0f ns/op wall  %8.0f ns/op CPU  %6.1f allocs/op  (medians of %d rounds of %d)",
			c.name, median(nsPerOp[i]), median(cpuPerOp[i]), median(allocsPerOp[i]), *ratioRounds, n)
	}
	// Ratios are taken in each round, between clients that ran one after
	// the other, and their median reported: less sensitive than a ratio of
	// medians to a neighbour that slowed down one round. CPU time is the
	// process's (client and server), which the other processes of a busy
	// machine do not inflate as they do wall time.
	perRound := func(xs [][]float64, a, b int) float64 {
		r := make([]float64, len(xs[a]))
		for k := range r {
			r[k] = xs[a][k] / xs[b][k]
		}
		return median(r)
	}
	for _, r := range ratios {
		t.Logf("%-26s wall %.3f  CPU %.3f", r.name, perRound(nsPerOp, r.a, r.b), perRound(cpuPerOp, r.a, r.b))
	}
}

// cpuTime returns the CPU time used by the process so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
