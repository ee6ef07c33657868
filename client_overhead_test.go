//go:build unix

package idempotency_test

import (
	"bytes"
	"context"
	"flag"
	"math/rand/v2"
	"net/http"
	"runtime"
	"testing"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/retryable"
)

var overheadRun = flag.Bool("client.overhead", false, "measure what each client adds to a POST on an in-memory transport, in interleaved rounds (TestPostOverheadRatio)")

// TestPostOverheadRatio is TestPostRatio on the in-memory transport of
// BenchmarkPostOverhead: what each client costs by itself, without the
// network. The clients take turns in rounds, in an order shuffled each
// round; it reports the median CPU time and allocations per request of
// each, and the medians of the per-round differences from "bare+key", a
// bare http.Client that sets a key header itself (a constant one, as in
// TestPostRatio), which is what the Client is measured against;
// "bare+NewKey" makes a new key for each request with NewKey. It asserts nothing about
// time; it runs only with -client.overhead:
//
//	go test -run '^TestPostOverheadRatio$' -client.overhead -count=1 -v .
func TestPostOverheadRatio(t *testing.T) {
	if !*overheadRun {
		t.Skip("a measurement: run with -client.overhead")
	}
	payload := bytes.Repeat([]byte("x"), 1024)
	ctx := context.Background()
	newRequest := func() *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.example/orders", bytes.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	finish := func(resp *http.Response, err error) {
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	hc := &http.Client{Transport: cannedTransport{}}
	keyValue := []string{idempotency.NewKey()}
	ic := clienttest.New(t, idempotency.WithHTTPClient(&http.Client{Transport: cannedTransport{}}))
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.HTTPClient = &http.Client{Transport: cannedTransport{}}
	prc := retryablehttp.NewClient()
	prc.Logger = nil
	prc.HTTPClient = &http.Client{Transport: cannedTransport{}}
	if err := retryable.Protect(prc); err != nil {
		t.Fatal(err)
	}
	viaRetryable := func(c *retryablehttp.Client) func() {
		return func() {
			req, err := retryablehttp.FromRequest(newRequest())
			if err != nil {
				t.Fatal(err)
			}
			finish(c.Do(req))
		}
	}
	clients := []struct {
		name string
		post func()
	}{
		{"bare", func() { finish(hc.Do(newRequest())) }},
		{"bare+key", func() {
			req := newRequest()
			req.Header[hdrKey] = keyValue
			finish(hc.Do(req))
		}},
		{"bare+NewKey", func() {
			req := newRequest()
			req.Header.Set(hdrKey, idempotency.NewKey())
			finish(hc.Do(req))
		}},
		{"idempotency", func() { finish(ic.Do(newRequest())) }},
		{"retryablehttp", viaRetryable(rc)},
		{"retryable.Protect", viaRetryable(prc)},
	}
	const bareKey = 1

	rounds, n := *ratioRounds, *ratioPerRound*5
	cpuPerOp := make([][]float64, len(clients))
	allocsPerOp := make([][]float64, len(clients))
	for _, c := range clients {
		for range 1000 {
			c.post()
		}
	}
	var ms runtime.MemStats
	order := make([]int, len(clients))
	for i := range order {
		order[i] = i
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	for range rounds {
		rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			mallocs := ms.Mallocs
			cpu := cpuTime(t)
			for range n {
				clients[i].post()
			}
			cpu = cpuTime(t) - cpu
			runtime.ReadMemStats(&ms)
			cpuPerOp[i] = append(cpuPerOp[i], float64(cpu.Nanoseconds())/float64(n))
			allocsPerOp[i] = append(allocsPerOp[i], float64(ms.Mallocs-mallocs)/float64(n))
		}
	}
	for i, c := range clients {
		diff := make([]float64, rounds)
		for k := range diff {
			diff[k] = cpuPerOp[i][k] - cpuPerOp[bareKey][k]
		}
		t.Logf("%-18s %7.0f ns/op CPU  %5.1f allocs/op  over bare+key: %+6.0f ns, %+5.1f allocs  (medians of %d rounds of %d)",
			c.name, median(cpuPerOp[i]), median(allocsPerOp[i]), median(diff),
			median(allocsPerOp[i])-median(allocsPerOp[bareKey]), rounds, n)
	}
}
