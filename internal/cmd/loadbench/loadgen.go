package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator is this program run again with -loadgen, in a process of
// its own, so that its CPU time is not counted as the server's. It reads
// jobs, one JSON object a line, on its standard input, and answers each with
// a result on its standard output. A job with no duration runs until the
// next line, a stop.

// job is one run of load.
type job struct {
	URL string `json:"url"`
	// Key is sent on every request; empty means a new key each.
	Key         string  `json:"key,omitempty"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	Stop        bool    `json:"stop,omitempty"`
}

// result is what the load generator measured.
type result struct {
	Requests int64            `json:"requests"`
	Errors   int64            `json:"errors"`
	Statuses map[string]int64 `json:"statuses"`
	Seconds  float64          `json:"seconds"`
	P50      time.Duration    `json:"p50"`
	P99      time.Duration    `json:"p99"`
	// CPU is the load generator's own CPU time during the run.
	CPU time.Duration `json:"cpu"`
	// KeyPrefix and Keys name the keys sent when each request had a new
	// one: KeyPrefix followed by 1 to Keys.
	KeyPrefix string `json:"key_prefix,omitempty"`
	Keys      int64  `json:"keys,omitempty"`
}

// ok returns the answers with the handler's status.
func (r result) ok() int64 { return r.Statuses[strconv.Itoa(http.StatusCreated)] }

// Every request is a POST of 1 KiB; the handler answers 201 with 1 KiB.
var (
	reqBody  = bytes.Repeat([]byte("q"), 1024)
	respBody = bytes.Repeat([]byte("r"), 1024)
)

// newRequest returns a load request, as the load generator sends it; the
// seeding of a replayed key uses it too, so that the fingerprints match.
func newRequest(url, key string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(reqBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// serveJobs is the load generator's main loop.
func serveJobs(in io.Reader, out io.Writer) error {
	lines := make(chan job)
	readErr := make(chan error, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			var j job
			if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
				readErr <- fmt.Errorf("loadgen: job: %w", err)
				return
			}
			lines <- j
		}
		readErr <- sc.Err()
	}()
	enc := json.NewEncoder(out)
	for j := range lines {
		if j.Stop {
			continue // a stop that came after its job ended
		}
		stop := make(chan struct{})
		done := make(chan result)
		go func() { done <- generate(j, stop) }()
		var res result
		if j.Seconds > 0 {
			res = <-done
		} else {
			// Until the next line, which must be a stop.
			next, ok := <-lines
			close(stop)
			res = <-done
			if !ok {
				return <-readErr
			}
			if !next.Stop {
				return errors.New("loadgen: a job while another runs")
			}
		}
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	return <-readErr
}

// generate runs j until its time is up or stop is closed.
func generate(j job, stop <-chan struct{}) result {
	tr := &http.Transport{
		MaxIdleConnsPerHost: j.Concurrency,
		MaxConnsPerHost:     j.Concurrency,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	prefix := ""
	if j.Key == "" {
		prefix = randomHex(6)
	}
	var (
		mu       sync.Mutex
		res      = result{Statuses: map[string]int64{}, KeyPrefix: prefix}
		lats     []time.Duration
		wg       sync.WaitGroup
		seq      atomic.Int64
		stopped  atomic.Bool
		deadline time.Time
	)
	if j.Seconds > 0 {
		deadline = time.Now().Add(time.Duration(j.Seconds * float64(time.Second)))
	}
	go func() {
		<-stop
		stopped.Store(true)
	}()
	cpu0 := selfCPU()
	start := time.Now()
	for range j.Concurrency {
		wg.Go(func() {
			statuses := map[int]int64{}
			var errs int64
			var mine []time.Duration
			for !stopped.Load() && (deadline.IsZero() || time.Now().Before(deadline)) {
				k := j.Key
				if k == "" {
					k = prefix + "-" + strconv.FormatInt(seq.Add(1), 10)
				}
				req, err := newRequest(j.URL, k)
				if err != nil {
					errs++
					break
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					errs++
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(t0))
				statuses[resp.StatusCode]++
			}
			mu.Lock()
			defer mu.Unlock()
			res.Errors += errs
			for s, n := range statuses {
				res.Statuses[strconv.Itoa(s)] += n
				res.Requests += n
			}
			lats = append(lats, mine...)
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.CPU = selfCPU() - cpu0
	res.Keys = seq.Load()
	slices.Sort(lats)
	res.P50, res.P99 = percentile(lats, 50), percentile(lats, 99)
	return res
}

// percentile returns the p-th percentile of sorted durations.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// loadgen is the parent's end of a load generator process.
type loadgen struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
}

// startLoadgen starts this program again as a load generator.
func startLoadgen() (*loadgen, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("loadbench: load generator: %w", err)
	}
	return startLoadgenCmd(exec.Command(self, "-loadgen"))
}

// startLoadgenCmd starts cmd, a load generator.
func startLoadgenCmd(cmd *exec.Cmd) (*loadgen, error) {
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("loadbench: load generator: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("loadbench: load generator: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("loadbench: load generator: %w", err)
	}
	return &loadgen{cmd: cmd, in: in, out: json.NewDecoder(out)}, nil
}

// run runs a job that has a duration and returns its result.
func (g *loadgen) run(j job) (result, error) {
	if err := g.send(j); err != nil {
		return result{}, err
	}
	return g.receive()
}

// start starts a job that runs until stop; stop returns its result.
func (g *loadgen) start(url string, concurrency int) (stop func() (result, error), err error) {
	if err := g.send(job{URL: url, Concurrency: concurrency}); err != nil {
		return nil, err
	}
	return func() (result, error) {
		if err := g.send(job{Stop: true}); err != nil {
			return result{}, err
		}
		return g.receive()
	}, nil
}

func (g *loadgen) send(j job) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if _, err := g.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("loadbench: load generator: %w", err)
	}
	return nil
}

func (g *loadgen) receive() (result, error) {
	var res result
	if err := g.out.Decode(&res); err != nil {
		return result{}, fmt.Errorf("loadbench: load generator: %w", err)
	}
	return res, nil
}

// close ends the load generator and waits for it.
func (g *loadgen) close() error {
	g.in.Close()
	return g.cmd.Wait()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
