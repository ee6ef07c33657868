// Command loadbench measures the middleware under HTTP load over loopback,
// on each store, side by side in one run with the bare handler:
//
//	go run ./internal/cmd/loadbench [-stores memory,postgres,redis] [-c 32] [-records 0] [-d 2s] [-rounds 3] [-json out.json]
//
// Every request is a POST with a 1 KiB body, answered 201 with a 1 KiB body.
// For each number of records held (-records) and each concurrency (-c), the
// phases are: bare, the handler without the middleware; and for each store,
// first (a new key on every request) and replay (one completed key on every
// request). The phases take turns, in an order shuffled each round, so that
// a drift of the machine (another process, a checkpoint) touches them all
// alike; each measure is reported by its median over the rounds, and the
// comparisons with bare are taken within each round.
//
// For each phase it reports requests per second and the p50 and p99
// latencies; the CPU time, per request, of this process (which serves HTTP
// and runs the middleware and the store client), with the bare handler's
// subtracted; the CPU time of the store server per request (a redis-server
// that it starts itself, and the PostgreSQL backends serving its pool, read
// from /proc); the store round trips per request, counted on the client's
// sockets; and the store server's own count of calls (Redis INFO
// commandstats; pg_stat_statements, where loaded). The load comes from this
// program run again as a separate process (-loadgen), whose CPU time is
// reported apart: it is not the server's.
//
// Before each phase a store holds the records of its level (-records, filled
// with copies of a real record) and the replayed key's; a first phase's
// records are removed after it. With -sweep n it also measures first
// executions before, during and after the removal of n expired records.
// Full-scale runs (a million records) take many minutes; nothing runs this
// program in CI.
//
// The PostgreSQL server is IDEMPOTENCY_POSTGRES_URL's (by default
// 127.0.0.1:5432, database test); the store uses a table of its own, dropped
// at the end. Internal/cmd/benchchart draws charts from the -json output.
//
// # The A/B mode
//
//	go run ./internal/cmd/loadbench -ab REV [-peer-dir DIR] [-minimal=true] [-stores …] [-c 32] [-records 10000] [-d 2s] [-rounds 4] [-json out.json]
//
// compares this tree with the git revision REV in one run, and with the
// peer middleware whose source is in DIR (github.com/repenguin22/idemlease
// and its nested modules pgstore and redistore; never downloaded), and with
// the minimal store statements (SET NX PX and SET XX PX, then GET; INSERT
// … ON CONFLICT DO NOTHING and UPDATE, then SELECT; a map under a mutex).
// Each variant on each store is a server process of its own (abserver,
// built from this tree, from REV extracted by git archive, from the peer's
// source), on a redis-server and a PostgreSQL table of its own; this
// process drives the load generator and measures. Each round runs every
// (variant, store, kind) phase once, shuffled, the variants of a store and
// kind next to each other; the server CPU per request is the server
// process's, from /proc; and the report gives, for each store and kind,
// this tree's requests per second, server CPU and store server CPU per
// request over each other variant's, a ratio per round, with their median
// and range.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// config is the command line.
type config struct {
	stores      []string
	concurrency []int
	records     []int
	duration    time.Duration
	rounds      int
	pool        int
	redisURL    string
	syncCommit  string
	jsonOut     string
	profile     string
	sweep       int
	sweepC      int
	sweepBatch  int
	// sweepStall ends a watch of Redis's or memstore's removal of expired
	// records when none has gone for that long.
	sweepStall time.Duration
	// sweepMax ends it after that long in any case.
	sweepMax time.Duration
	// ab is the revision that the A/B mode compares this tree with,
	// peerDir the source of the peer it compares it with, and minimal
	// says whether it also runs the minimal statements.
	ab      string
	peerDir string
	minimal bool
	args    []string
}

// abMode says whether cfg asks for the A/B mode.
func (c config) abMode() bool { return c.ab != "" || c.peerDir != "" }

func main() {
	log.SetFlags(0)
	var (
		cfg     config
		loadgen = flag.Bool("loadgen", false, "run as the load generator (internal)")
		stores  = flag.String("stores", "memory,postgres,redis", "stores to measure, comma-separated: memory, postgres, redis")
		conc    = flag.String("c", "32", "concurrent clients, comma-separated levels")
		records = flag.String("records", "0", "records each store holds, comma-separated levels")
	)
	flag.DurationVar(&cfg.duration, "d", 2*time.Second, "duration of each phase")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds of the phases; each measure is reported by its median")
	flag.IntVar(&cfg.pool, "pool", 32, "most connections of each network store's client")
	flag.StringVar(&cfg.redisURL, "redis-url", "", "use this Redis instead of starting a redis-server (its CPU time is then not measured)")
	flag.StringVar(&cfg.syncCommit, "pg-synchronous-commit", "", "PostgreSQL synchronous_commit for the store's sessions (default: the server's)")
	flag.StringVar(&cfg.jsonOut, "json", "", "write the results to this file, for benchchart")
	flag.StringVar(&cfg.profile, "cpuprofile", "", "write a CPU profile of each store phase's first round to files with this prefix")
	flag.IntVar(&cfg.sweep, "sweep", 0, "also measure first executions around the removal of this many expired records")
	flag.IntVar(&cfg.sweepC, "sweep-c", 8, "concurrent clients of -sweep")
	flag.IntVar(&cfg.sweepBatch, "sweep-batch", 1000, "pgstore Sweep batch of -sweep")
	flag.DurationVar(&cfg.sweepStall, "sweep-stall", 10*time.Second, "end the watch of an expiry of -sweep when no record has gone for this long")
	flag.DurationVar(&cfg.sweepMax, "sweep-max", time.Minute, "end the watch of an expiry of -sweep after this long")
	flag.StringVar(&cfg.ab, "ab", "", "A/B mode: compare this tree with this git revision, each variant a server process of its own (-rounds 4 and -records 10000 unless given)")
	flag.StringVar(&cfg.peerDir, "peer-dir", "", "A/B mode: also compare with the peer middleware whose source is in this directory (github.com/repenguin22/idemlease)")
	flag.BoolVar(&cfg.minimal, "minimal", true, "A/B mode: also compare with the minimal store statements")
	flag.Parse()
	if *loadgen {
		if err := serveJobs(os.Stdin, os.Stdout); err != nil {
			log.Fatal(err)
		}
		return
	}
	cfg.args = os.Args[1:]
	var err error
	if cfg.stores, err = parseStores(*stores); err == nil {
		if cfg.concurrency, err = parseInts(*conc, 1); err == nil {
			cfg.records, err = parseInts(*records, 0)
		}
	}
	if err == nil && cfg.abMode() {
		err = abDefaults(&cfg, flagsSet())
	}
	if err == nil && cfg.rounds < 1 {
		err = errors.New("loadbench: -rounds must be at least 1")
	}
	if err == nil && (cfg.pool < 1 || cfg.sweepC < 1 || cfg.sweepBatch < 1 || cfg.duration <= 0 || cfg.sweepStall <= 0 || cfg.sweepMax <= 0) {
		err = errors.New("loadbench: -pool, -d and the -sweep settings must be positive")
	}
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	runner := run
	if cfg.abMode() {
		runner = runAB
	}
	rep, err := runner(ctx, cfg, os.Stdout, startLoadgen)
	if rep != nil && cfg.jsonOut != "" {
		if werr := writeReport(cfg.jsonOut, rep); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

// flagsSet returns the names of the flags given on the command line.
func flagsSet() map[string]bool {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// abDefaults applies the A/B mode's defaults to what the command line did
// not set, and refuses what the mode does not do.
func abDefaults(cfg *config, set map[string]bool) error {
	for _, name := range []string{"sweep", "cpuprofile", "redis-url"} {
		if set[name] {
			return fmt.Errorf("loadbench: -%s is not in the A/B mode", name)
		}
	}
	if !set["rounds"] {
		cfg.rounds = 4
	}
	if !set["records"] {
		// An empty table makes PostgreSQL's generic plans sequential
		// scans (BENCHMARKS.md, "An empty pgstore table").
		cfg.records = []int{10_000}
	}
	return nil
}

func writeReport(path string, rep *benchreport.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.Write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func parseStores(s string) ([]string, error) {
	var out []string
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		switch name {
		case benchreport.Memory, benchreport.Postgres, benchreport.Redis:
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		default:
			return nil, fmt.Errorf("loadbench: unknown store %q (memory, postgres or redis)", name)
		}
	}
	return out, nil
}

// parseInts parses a comma-separated list of integers of at least least.
// Underscores may group digits: 1_000_000.
func parseInts(s string, least int) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.ReplaceAll(strings.TrimSpace(f), "_", ""))
		if err != nil || n < least {
			return nil, fmt.Errorf("loadbench: %q: want integers of at least %d, comma-separated", s, least)
		}
		out = append(out, n)
	}
	return out, nil
}
