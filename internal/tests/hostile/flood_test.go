package hostile_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/testproc"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

var long = flag.Bool("hostile.long", false, "flood for longer, bounded and unbounded, for the figures")

// floodCount counts the answers of a flood by status.
type floodCount struct {
	mu       sync.Mutex
	statuses map[int]int
	errors   int
}

func (c *floodCount) add(status int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.errors++
		return
	}
	if c.statuses == nil {
		c.statuses = map[int]int{}
	}
	c.statuses[status]++
}

func (c *floodCount) get(status int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statuses[status]
}

func (c *floodCount) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%v, %d transport errors", c.statuses, c.errors)
}

// flood sends POSTs with unique keys to url from workers goroutines, until n
// have been sent or, when n is 0, until d has passed. It returns how many it
// sent and how long that took.
func flood(url string, workers, n int, d time.Duration, count *floodCount) (int, time.Duration) {
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var next atomic.Int64
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if (n > 0 && i > int64(n)) || (n == 0 && time.Now().After(end)) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"sku":"A"}`))
				req.Header.Set("Idempotency-Key", "flood-"+strconv.FormatInt(i, 10))
				resp, err := c.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count.add(resp.StatusCode, nil)
					continue
				}
				count.add(0, err)
			}
		})
	}
	wg.Wait()
	sent := int(next.Load()) - workers
	return sent, time.Since(start)
}

// TestFloodOfUniqueKeys: thousands of unique keys, as fast as a client can
// send them, against memstore bounded to a thousand records. The first
// thousand run; every later one is refused with 503 and runs nothing; the
// store never holds more than its bound; and the requests it did run still
// replay.
func TestFloodOfUniqueKeys(t *testing.T) {
	const bound, sent = 1000, 4000
	store := teststores.Memory(t, memstore.WithMaxRecords(bound))
	mw, err := server.New(store)
	require.NoError(t, err)
	var executions atomic.Int64
	srv := httptest.NewUnstartedServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order")
	})))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)

	var count floodCount
	n, took := flood(srv.URL+"/orders", 8, sent, 0, &count)
	t.Logf("%d unique keys in %v (%.0f/s): %s; %d records", n, took.Round(time.Millisecond), float64(n)/took.Seconds(), &count, store.Len())
	assert.Equal(t, sent, n)
	assert.Equal(t, bound, count.get(http.StatusCreated), "201s")
	assert.Equal(t, sent-bound, count.get(http.StatusServiceUnavailable), "503s")
	assert.Equal(t, int64(bound), executions.Load(), "executions")
	assert.Equal(t, bound, store.Len(), "records")

	// What ran is still protected: a retry of the first key replays.
	for i := 1; i <= sent; i++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A"}`))
		req.Header.Set("Idempotency-Key", "flood-"+strconv.Itoa(i))
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusCreated {
			assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
			break
		}
	}
	assert.Equal(t, int64(bound), executions.Load(), "executions after the retry")
}

// floodStats is what floodserver says of itself.
type floodStats struct{ Records, Bytes, Executions int64 }

func stats(t *testing.T, addr string) floodStats {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var s floodStats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// rssRun is one flood of a floodserver process.
type rssRun struct {
	maxBytes int64 // 0: memstore's default bounds
	body     int
	keys     int           // keys to send, or 0 to flood for a while
	duration time.Duration // how long to flood when keys is 0
}

type rssResult struct {
	sent                 int
	took                 time.Duration
	baseline, peak, last int64
	stats                floodStats
	count                *floodCount
}

func (r rssRun) run(t *testing.T, bin string) rssResult {
	args := []string{"-body", strconv.Itoa(r.body)}
	if r.maxBytes > 0 {
		args = append(args, "-max-bytes", strconv.FormatInt(r.maxBytes, 10))
	}
	p := testproc.Start(t, bin, args)
	defer p.Kill()
	res := rssResult{count: &floodCount{}}
	var err error
	res.baseline, err = p.RSS()
	require.NoError(t, err)
	res.sent, res.took = flood("http://"+p.Addr+"/orders", 8, r.keys, r.duration, res.count)
	res.stats = stats(t, p.Addr)
	res.peak, err = p.PeakRSS()
	require.NoError(t, err)
	res.last, err = p.RSS()
	require.NoError(t, err)
	return res
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func (r rssRun) log(t *testing.T, res rssResult) {
	bound := "memstore's defaults (1,000,000 records, 256 MiB)"
	if r.maxBytes > 0 {
		bound = "WithMaxBytes(" + mib(r.maxBytes) + ")"
	}
	t.Logf("%s, %d-byte responses: %d unique keys in %v (%.0f/s): %s; store %d records, %s accounted, %d executions; RSS %s at start, peak %s, %s at the end",
		bound, r.body, res.sent, res.took.Round(time.Millisecond), float64(res.sent)/res.took.Seconds(), res.count,
		res.stats.Records, mib(res.stats.Bytes), res.stats.Executions, mib(res.baseline), mib(res.peak), mib(res.last))
}

// TestFloodMemory floods a server process, whose memstore is bounded to
// 4 MiB, with unique keys whose responses, if all were kept, would take
// 47 MiB, and reads its resident memory from /proc: the peak grows by less
// than four times the bound plus 8 MiB (the store's own overhead beyond the
// bytes it accounts, the garbage collector's headroom, the connections).
// Without the bound the same flood grows it by about 64 MiB. Run with
// -hostile.long for both, and for ten-second floods.
func TestFloodMemory(t *testing.T) {
	bin := testproc.Build(t, "github.com/idemkit/idempotency/internal/tests/hostile/floodserver")
	runs := []rssRun{{maxBytes: 4 << 20, body: 8 << 10, keys: 6000}}
	if *long {
		runs = []rssRun{
			{maxBytes: 4 << 20, body: 8 << 10, keys: 6000},
			{body: 8 << 10, keys: 6000},
			{maxBytes: 16 << 20, body: 1 << 10, duration: 10 * time.Second},
			{body: 1 << 10, duration: 10 * time.Second},
		}
	}
	for _, r := range runs {
		name := fmt.Sprintf("unbounded, %d-byte responses", r.body)
		if r.maxBytes > 0 {
			name = fmt.Sprintf("bounded to %s, %d-byte responses", mib(r.maxBytes), r.body)
		}
		t.Run(name, func(t *testing.T) {
			res := r.run(t, bin)
			r.log(t, res)
			assert.Zero(t, res.count.errors, "transport errors")
			assert.Equal(t, res.stats.Records, res.stats.Executions, "executions and records")
			assert.Equal(t, int64(res.count.get(http.StatusCreated)), res.stats.Executions, "201s and executions")
			if r.maxBytes == 0 {
				return
			}
			assert.LessOrEqual(t, res.stats.Bytes, r.maxBytes, "bytes accounted")
			assert.Positive(t, res.count.get(http.StatusServiceUnavailable), "the flood never reached the bound")
			assert.Less(t, res.peak-res.baseline, 4*r.maxBytes+(8<<20), "peak RSS growth")
		})
	}
}
