// Command loadbench measures the middleware under load over loopback, side
// by side in one run with the bare handler and with the store alone:
//
//	go run ./internal/cmd/loadbench -store memory|postgres|redis [-c 32] [-d 3s] [-rounds 3]
//
// The HTTP load comes from a separate process (this program, re-executed
// with -loadgen), so that the load generator's work is not counted against
// the server's. Every request is a POST with a 1 KiB body, answered 201 with
// a 1 KiB body. The phases are:
//
//   - bare: the handler without the middleware;
//   - first: the middleware, a new key on every request;
//   - replay: the middleware, one key, so every request is a replay;
//   - raw first / raw replay: the store's own Claim+Complete (or Claim of a
//     completed key) from c goroutines in this process, no HTTP.
//
// On a machine where the HTTP work and the store's work share the cores, the
// ceiling for a store-backed request is 1 / (1/bare + 1/raw); the program
// reports each middleware phase as a share of that ceiling.
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
	"github.com/idemkit/idempotency/server/pgstore"
	"github.com/idemkit/idempotency/server/redisstore"
)

func main() {
	log.SetFlags(0)
	var (
		loadgen  = flag.Bool("loadgen", false, "run as the load generator (internal)")
		url      = flag.String("url", "", "load generator: target URL")
		key      = flag.String("key", "", "load generator: send this key on every request (default: a new key each)")
		store    = flag.String("store", "memory", "store: memory, postgres or redis")
		conc     = flag.Int("c", 32, "concurrent clients")
		duration = flag.Duration("d", 3*time.Second, "duration of each phase")
		rounds   = flag.Int("rounds", 3, "rounds of the phases; each phase is reported by its median")
		profile  = flag.String("cpuprofile", "", "write a CPU profile of the first round's first phase to this file")
	)
	flag.Parse()
	if *loadgen {
		if err := generate(*url, *key, *conc, *duration); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *rounds < 1 {
		log.Fatal("loadbench: -rounds must be at least 1")
	}
	if err := run(*store, *conc, *duration, *rounds, *profile); err != nil {
		log.Fatal(err)
	}
}

var (
	reqBody  = bytes.Repeat([]byte("q"), 1024)
	respBody = bytes.Repeat([]byte("r"), 1024)
)

func handler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(respBody)
}

// result is what the load generator reports.
type result struct {
	Requests int64         `json:"requests"`
	Errors   int64         `json:"errors"`
	Statuses map[int]int64 `json:"statuses"`
	Seconds  float64       `json:"seconds"`
	P50      time.Duration `json:"p50"`
	P99      time.Duration `json:"p99"`
}

func (r result) rate() float64 { return float64(r.Statuses[http.StatusCreated]) / r.Seconds }

func generate(url, key string, conc int, d time.Duration) error {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, DisableCompression: true}
	client := &http.Client{Transport: tr}
	prefix := randomHex(6)
	var (
		mu       sync.Mutex
		res      = result{Statuses: map[int]int64{}}
		lats     []time.Duration
		wg       sync.WaitGroup
		seq      atomic.Int64
		deadline = time.Now().Add(d)
	)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			local := map[int]int64{}
			var errs int64
			var mine []time.Duration
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(reqBody))
				k := key
				if k == "" {
					k = prefix + "-" + strconv.FormatInt(seq.Add(1), 10)
				}
				req.Header.Set("Idempotency-Key", k)
				req.Header.Set("Content-Type", "application/json")
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					errs++
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(t0))
				local[resp.StatusCode]++
			}
			mu.Lock()
			defer mu.Unlock()
			res.Errors += errs
			for s, n := range local {
				res.Statuses[s] += n
				res.Requests += n
			}
			lats = append(lats, mine...)
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	slices.Sort(lats)
	if len(lats) > 0 {
		res.P50 = lats[len(lats)/2]
		res.P99 = lats[len(lats)*99/100]
	}
	tr.CloseIdleConnections()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// load runs the load generator in a child process against url.
func load(url, key string, conc int, d time.Duration) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	args := []string{"-loadgen", "-url", url, "-c", strconv.Itoa(conc), "-d", d.String()}
	if key != "" {
		args = append(args, "-key", key)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return result{}, fmt.Errorf("load generator: %w", err)
	}
	var res result
	if err := json.Unmarshal(out, &res); err != nil {
		return result{}, fmt.Errorf("load generator output: %w", err)
	}
	return res, nil
}

func serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String() + "/orders", func() { srv.Close() }, nil
}

func run(kind string, conc int, d time.Duration, rounds int, profile string) error {
	ctx := context.Background()
	store, cleanup, err := openStore(ctx, kind, conc)
	if err != nil {
		return err
	}
	defer cleanup()
	mw, err := server.New(store)
	if err != nil {
		return err
	}
	bareURL, stopBare, err := serve(http.HandlerFunc(handler))
	if err != nil {
		return err
	}
	defer stopBare()
	mwURL, stopMW, err := serve(mw.Handler(http.HandlerFunc(handler)))
	if err != nil {
		return err
	}
	defer stopMW()
	replayKey := "replay-" + randomHex(6)
	if _, err := load(mwURL, replayKey, 1, 100*time.Millisecond); err != nil {
		return err
	}
	// The raw phases have a store of their own, so that the millions of
	// records they write (an in-memory store's, above all) do not weigh
	// on the HTTP phases.
	rawStore, rawCleanup, err := openStore(ctx, kind, conc)
	if err != nil {
		return err
	}
	defer rawCleanup()

	fmt.Printf("store %s, %d concurrent clients, %d rounds of %v per phase, 1 KiB bodies\n\n", kind, conc, rounds, d)
	// The phases take turns, round after round, so that a drift of the
	// machine (a checkpoint, another process) touches them all alike; each
	// is reported by its median round.
	var bare, first, replay []result
	var rawFirst, rawReplay []float64
	for round := range rounds {
		r, err := load(bareURL, "", conc, d)
		if err != nil {
			return err
		}
		bare = append(bare, r)
		if profile != "" && round == 0 {
			f, err := os.Create(profile)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
		}
		r, err = load(mwURL, "", conc, d)
		pprof.StopCPUProfile()
		if err != nil {
			return err
		}
		first = append(first, r)
		if r, err = load(mwURL, replayKey, conc, d); err != nil {
			return err
		}
		replay = append(replay, r)
		rf, err := raw(ctx, rawStore, conc, d, false)
		if err != nil {
			return err
		}
		rawFirst = append(rawFirst, rf)
		rr, err := raw(ctx, rawStore, conc, d, true)
		if err != nil {
			return err
		}
		rawReplay = append(rawReplay, rr)
		fmt.Printf("round %d: bare %.0f/s, first %.0f/s, replay %.0f/s, raw first %.0f/s, raw replay %.0f/s\n",
			round+1, bare[round].rate(), first[round].rate(), replay[round].rate(), rf, rr)
	}

	fmt.Printf("\nmedians\n%-12s %12s %10s %10s %s\n", "phase", "per second", "p50", "p99", "other")
	row := func(name string, rs []result) float64 {
		r := medianResult(rs)
		other := ""
		for s, n := range r.Statuses {
			if s != http.StatusCreated {
				other += fmt.Sprintf(" %d×%d", n, s)
			}
		}
		if r.Errors > 0 {
			other += fmt.Sprintf(" %d errors", r.Errors)
		}
		fmt.Printf("%-12s %12.0f %10v %10v%s\n", name, r.rate(), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), other)
		return r.rate()
	}
	b, f, rp := row("bare", bare), row("first", first), row("replay", replay)
	rf, rr := median(rawFirst), median(rawReplay)
	fmt.Printf("%-12s %12.0f\n", "raw first", rf)
	fmt.Printf("%-12s %12.0f\n", "raw replay", rr)
	ceiling := func(raw float64) float64 { return 1 / (1/b + 1/raw) }
	fmt.Printf("\nfirst:  %.0f/s = %.0f%% of the combined ceiling %.0f/s (%.0f%% of bare)\n",
		f, 100*f/ceiling(rf), ceiling(rf), 100*f/b)
	fmt.Printf("replay: %.0f/s = %.0f%% of the combined ceiling %.0f/s (%.0f%% of bare)\n",
		rp, 100*rp/ceiling(rr), ceiling(rr), 100*rp/b)
	return nil
}

func medianResult(rs []result) result {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b result) int { return cmp.Compare(a.rate(), b.rate()) })
	return sorted[len(sorted)/2]
}

func median(xs []float64) float64 {
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// raw drives the store alone: Claim+Complete of new keys, or Claim of a
// completed key, from conc goroutines. It returns operations per second.
func raw(ctx context.Context, store server.Store, conc int, d time.Duration, replay bool) (float64, error) {
	prefix := randomHex(6)
	resp := &server.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: respBody}
	replayID := server.ID{Key: prefix + "-replay"}
	if replay {
		c, err := store.Claim(ctx, replayID, "fp", time.Minute, time.Hour)
		if err != nil {
			return 0, err
		}
		if err := store.Complete(ctx, replayID, c.Token, resp, time.Hour); err != nil {
			return 0, err
		}
	}
	var (
		ops      atomic.Int64
		seq      atomic.Int64
		firstErr error
		once     sync.Once
		wg       sync.WaitGroup
		deadline = time.Now().Add(d)
	)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				var err error
				if replay {
					var c server.Claim
					c, err = store.Claim(ctx, replayID, "fp", time.Minute, time.Hour)
					if err == nil && c.Status != server.Completed {
						err = fmt.Errorf("replay claim: %v", c.Status)
					}
				} else {
					id := server.ID{Key: prefix + "-" + strconv.FormatInt(seq.Add(1), 10)}
					var c server.Claim
					c, err = store.Claim(ctx, id, "fp", time.Minute, time.Hour)
					if err == nil {
						err = store.Complete(ctx, id, c.Token, resp, time.Hour)
					}
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(ops.Load()) / time.Since(start).Seconds(), firstErr
}

func openStore(ctx context.Context, kind string, conc int) (server.Store, func(), error) {
	switch kind {
	case "memory":
		// Bounds far above what a run stores: the raw phase alone
		// stores over a million records.
		s, err := memstore.New(memstore.WithMaxRecords(1<<26), memstore.WithMaxBytes(16<<30))
		if err != nil {
			return nil, nil, err
		}
		return s, func() { s.Close() }, nil
	case "postgres":
		cfg, err := pgxpool.ParseConfig(env("IDEMPOTENCY_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
		if err != nil {
			return nil, nil, errors.New("loadbench: IDEMPOTENCY_POSTGRES_URL is not a valid URL")
		}
		cfg.MaxConns = int32(conc)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		table := "idempotency_loadbench_" + randomHex(4)
		s, err := pgstore.New(pool, pgstore.WithTable(table))
		if err == nil {
			err = s.Migrate(ctx)
		}
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, func() {
			s.Close()
			pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
			pool.Close()
		}, nil
	case "redis":
		opt, err := redis.ParseURL(env("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:6379/0"))
		if err != nil {
			return nil, nil, errors.New("loadbench: IDEMPOTENCY_REDIS_URL is not a valid URL")
		}
		opt.PoolSize = conc
		client := redis.NewClient(opt)
		prefix := "idempotency-loadbench-" + randomHex(4) + ":"
		s, err := redisstore.New(client, redisstore.WithPrefix(prefix))
		if err != nil {
			client.Close()
			return nil, nil, err
		}
		return s, func() {
			iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			var keys []string
			for iter.Next(ctx) {
				keys = append(keys, iter.Val())
				if len(keys) == 1000 {
					client.Unlink(ctx, keys...)
					keys = keys[:0]
				}
			}
			if len(keys) > 0 {
				client.Unlink(ctx, keys...)
			}
			client.Close()
		}, nil
	}
	return nil, nil, fmt.Errorf("loadbench: unknown store %q (memory, postgres or redis)", kind)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
