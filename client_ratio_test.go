package idempotency_test

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency"
)

var (
	ratioRun      = flag.Bool("client.ratio", false, "measure the cost of a loopback POST through each client, in interleaved rounds (TestPostRatio)")
	ratioRounds   = flag.Int("client.rounds", 21, "rounds of -client.ratio")
	ratioPerRound = flag.Int("client.perround", 2000, "requests per client and round of -client.ratio")
)

// TestPostRatio measures one POST of 1 KiB answered 201 over a keep-alive
// loopback connection through a bare http.Client, this package's Client
// and a stock go-retryablehttp client, in one process: the clients take
// turns in rounds, in an order that rotates, so that the noise of a shared
// machine falls on all of them alike. It reports the median time and
// allocations per request of each, and their ratios. It asserts nothing
// about time; it runs only with -client.ratio:
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
	newTransport := func() *http.Transport {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		t.Cleanup(tr.CloseIdleConnections)
		return tr
	}
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

	hc := &http.Client{Transport: newTransport()}
	ic := idempotency.NewClient(idempotency.WithHTTPClient(&http.Client{Transport: newTransport()}))
	rc := retryablehttp.NewClient()
	rc.Logger = nil
	rc.HTTPClient = &http.Client{Transport: newTransport()}
	clients := []struct {
		name string
		post func()
	}{
		{"bare", func() { finish(hc.Do(newRequest())) }},
		{"idempotency", func() { finish(ic.Do(newRequest())) }},
		{"retryablehttp", func() {
			req, err := retryablehttp.FromRequest(newRequest())
			if err != nil {
				t.Fatal(err)
			}
			finish(rc.Do(req))
		}},
	}

	n := *ratioPerRound
	nsPerOp := make([][]float64, len(clients))
	allocsPerOp := make([][]float64, len(clients))
	for _, c := range clients {
		for range 100 { // warm up connections and pools
			c.post()
		}
	}
	var ms runtime.MemStats
	for round := range *ratioRounds {
		for j := range clients {
			i := (round + j) % len(clients)
			runtime.ReadMemStats(&ms)
			mallocs := ms.Mallocs
			start := time.Now()
			for range n {
				clients[i].post()
			}
			elapsed := time.Since(start)
			runtime.ReadMemStats(&ms)
			nsPerOp[i] = append(nsPerOp[i], float64(elapsed.Nanoseconds())/float64(n))
			allocsPerOp[i] = append(allocsPerOp[i], float64(ms.Mallocs-mallocs)/float64(n))
		}
	}

	ns := make([]float64, len(clients))
	for i, c := range clients {
		ns[i] = median(nsPerOp[i])
		t.Logf("%-14s %8.0f ns/op  %6.1f allocs/op  (median of %d rounds of %d)", c.name, ns[i], median(allocsPerOp[i]), *ratioRounds, n)
	}
	t.Logf("idempotency/bare          %.3f", ns[1]/ns[0])
	t.Logf("retryablehttp/bare        %.3f", ns[2]/ns[0])
	t.Logf("idempotency/retryablehttp %.3f", ns[1]/ns[2])
	// The same ratios per round, whose median is less sensitive to a
	// round that a neighbour slowed down for one client only.
	perRound := func(a, b int) float64 {
		r := make([]float64, len(nsPerOp[a]))
		for k := range r {
			r[k] = nsPerOp[a][k] / nsPerOp[b][k]
		}
		return median(r)
	}
	t.Logf("median of per-round ratios: idempotency/bare %.3f, retryablehttp/bare %.3f, idempotency/retryablehttp %.3f",
		perRound(1, 0), perRound(2, 0), perRound(1, 2))
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
