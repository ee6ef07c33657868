package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// bench is one run: the load generator, the servers, the stores.
type bench struct {
	cfg       config
	newGen    func() (*loadgen, error)
	out       io.Writer
	gen       *loadgen
	replayKey string
	bareURL   string
	stores    []*storeTarget
}

// storeTarget is a store behind a listener of its own.
type storeTarget struct {
	storeBench
	swap *swapHandler
	url  string
}

// serve serves h on a loopback port until stop is called.
func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	return "http://" + ln.Addr().String() + "/orders", func() {
		srv.Close()
		<-done
	}, nil
}

// run runs the benchmark that cfg describes, printing as it goes to out, with
// load generators that newGen starts.
func run(ctx context.Context, cfg config, out io.Writer, newGen func() (*loadgen, error)) (rep *benchreport.Report, err error) {
	b := &bench{cfg: cfg, out: out, newGen: newGen, replayKey: "replay-" + randomHex(6)}
	rep = &benchreport.Report{
		Command: "go run ./internal/cmd/loadbench " + strings.Join(cfg.args, " "),
		Machine: describeMachine(),
		Settings: benchreport.Settings{
			PhaseSeconds: cfg.duration.Seconds(),
			Rounds:       cfg.rounds,
			BodyBytes:    len(reqBody),
			Pool:         cfg.pool,
			Concurrency:  cfg.concurrency,
			Records:      cfg.records,
			Stores:       cfg.stores,
		},
	}
	defer func() {
		if rep != nil { // nil when the run could not start
			rep.Machine.LoadAfter = loadAverage()
		}
	}()

	if b.gen, err = newGen(); err != nil {
		return nil, err
	}
	defer b.gen.close()
	bare := &swapHandler{}
	bare.set(http.HandlerFunc(handler))
	url, stop, err := serve(bare)
	if err != nil {
		return nil, err
	}
	defer stop()
	b.bareURL = url
	defer func() {
		for _, st := range b.stores {
			st.close()
		}
	}()
	for _, name := range cfg.stores {
		var sb storeBench
		switch name {
		case benchreport.Memory:
			sb = newMemoryBench(b.replayKey)
		case benchreport.Postgres:
			p, err := newPostgresBench(ctx, b.replayKey, cfg.pool, cfg.syncCommit)
			if err != nil {
				return nil, err
			}
			rep.Machine.Postgres = p.version
			rep.Settings.PostgresCPU = "none: the server is not on this machine"
			if _, ok := p.backends.total(); ok {
				rep.Settings.PostgresCPU = "the backends serving the store's pool"
			}
			sb = p
		case benchreport.Redis:
			r, err := newRedisBench(ctx, b.replayKey, cfg.pool, cfg.redisURL)
			if err != nil {
				return nil, err
			}
			rep.Machine.Redis = r.version
			rep.Settings.RedisServer = "external"
			if r.own != nil {
				rep.Settings.RedisServer = "own"
			}
			sb = r
		}
		st := &storeTarget{storeBench: sb, swap: &swapHandler{}}
		b.stores = append(b.stores, st)
		if st.url, stop, err = serve(st.swap); err != nil {
			return nil, err
		}
		defer stop()
	}

	fmt.Fprintf(out, "stores %s; concurrency %v; records %v; %d rounds of %v per phase; 1 KiB bodies; load %.2f %.2f %.2f\n",
		strings.Join(cfg.stores, ", "), cfg.concurrency, cfg.records, cfg.rounds, cfg.duration,
		rep.Machine.LoadBefore[0], rep.Machine.LoadBefore[1], rep.Machine.LoadBefore[2])
	for _, n := range cfg.records {
		if err := b.level(ctx, rep, n); err != nil {
			return rep, err
		}
	}
	if cfg.sweep > 0 {
		if err := b.sweeps(ctx, rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// phaseSpec names a phase of a round.
type phaseSpec struct {
	st   *storeTarget // nil for bare
	kind string
}

func (p phaseSpec) store() string {
	if p.st == nil {
		return benchreport.Bare
	}
	return p.st.name()
}

// level runs every round at one number of records held.
func (b *bench) level(ctx context.Context, rep *benchreport.Report, n int) error {
	fmt.Fprintf(b.out, "\n== %d records\n", n)
	for _, st := range b.stores {
		start := time.Now()
		items, err := st.fill(ctx, n)
		if err != nil {
			return fmt.Errorf("loadbench: filling %s with %d records: %w", st.name(), n, err)
		}
		if n > 0 {
			fmt.Fprintf(b.out, "filled %s with %d records in %v\n", st.name(), n, time.Since(start).Round(time.Millisecond))
		}
		if len(items) > 0 {
			rep.Sizes = append(rep.Sizes, benchreport.Size{Store: st.name(), Records: n, Items: items})
		}
	}
	specs := []phaseSpec{{kind: benchreport.KindBare}}
	for _, st := range b.stores {
		specs = append(specs, phaseSpec{st, benchreport.KindFirst}, phaseSpec{st, benchreport.KindReplay})
	}
	// A short unmeasured run of every phase first, so that what happens
	// once (connections, prepared statements, loaded functions) is not
	// in the first round.
	for _, sp := range specs {
		if _, err := b.phase(ctx, sp, slices.Max(b.cfg.concurrency), min(b.cfg.duration, time.Second), false); err != nil {
			return fmt.Errorf("loadbench: warming up %s %s: %w", sp.store(), sp.kind, err)
		}
	}
	phases := map[string]*benchreport.Phase{}
	var order []string
	for round := range b.cfg.rounds {
		for _, c := range b.cfg.concurrency {
			measures := map[phaseSpec]benchreport.Measure{}
			shuffled := append([]phaseSpec(nil), specs...)
			rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			for _, sp := range shuffled {
				if err := ctx.Err(); err != nil {
					return err
				}
				m, err := b.phase(ctx, sp, c, b.cfg.duration, round == 0 && c == b.cfg.concurrency[0])
				if err != nil {
					return fmt.Errorf("loadbench: %s %s, %s: %w", sp.store(), sp.kind, clients(c), err)
				}
				measures[sp] = m
			}
			bare := measures[specs[0]]
			var line []string
			for _, sp := range specs {
				m := measures[sp]
				if sp.st != nil {
					over := m.ServerCPU - bare.ServerCPU
					m.ServerCPUOverBare = &over
					if bare.PerSecond > 0 {
						vs := m.PerSecond / bare.PerSecond
						m.PerSecondVsBare = &vs
					}
				}
				key := fmt.Sprintf("%d/%s/%s", c, sp.store(), sp.kind)
				p, ok := phases[key]
				if !ok {
					p = &benchreport.Phase{Records: n, Concurrency: c, Store: sp.store(), Kind: sp.kind}
					phases[key] = p
					order = append(order, key)
				}
				p.Rounds = append(p.Rounds, m)
				line = append(line, fmt.Sprintf("%s %.0f/s", shortName(sp), m.PerSecond))
			}
			fmt.Fprintf(b.out, "round %d, %s: %s\n", round+1, clients(c), strings.Join(line, ", "))
		}
	}
	var done []benchreport.Phase
	for _, key := range order {
		p := phases[key]
		p.Summarize()
		done = append(done, *p)
	}
	rep.Phases = append(rep.Phases, done...)
	printLevel(b.out, n, b.cfg, done)
	return nil
}

func shortName(sp phaseSpec) string {
	if sp.st == nil {
		return "bare"
	}
	return sp.st.name() + " " + sp.kind
}

// phase runs one phase and measures it.
func (b *bench) phase(ctx context.Context, sp phaseSpec, c int, d time.Duration, profile bool) (benchreport.Measure, error) {
	url, key := b.bareURL, ""
	var m meters
	if sp.st != nil {
		if err := sp.st.beforePhase(ctx); err != nil {
			return benchreport.Measure{}, err
		}
		sp.st.swap.set(sp.st.handler())
		url, m = sp.st.url, sp.st.meters()
		if sp.kind == benchreport.KindReplay {
			key = b.replayKey
		}
	}
	// Garbage from what came before is collected now, not in the phase.
	runtime.GC()
	stopProfile, err := b.startProfile(sp, profile)
	if err != nil {
		return benchreport.Measure{}, err
	}
	before := m.read(ctx)
	cpu0 := selfCPU()
	res, err := b.gen.run(job{URL: url, Key: key, Concurrency: c, Seconds: d.Seconds()})
	cpu := selfCPU() - cpu0
	after := m.read(ctx)
	stopProfile()
	if err != nil {
		return benchreport.Measure{}, err
	}
	if sp.st != nil {
		if err := sp.st.afterPhase(ctx, sp.kind, res.KeyPrefix, res.Keys); err != nil {
			return benchreport.Measure{}, err
		}
	}
	if res.Requests == 0 {
		return benchreport.Measure{}, fmt.Errorf("no answers (%d transport errors)", res.Errors)
	}
	per := func(x float64) float64 { return x / float64(res.Requests) }
	ms := newMeasure(res, cpu)
	if ms.Other > 0 {
		fmt.Fprintf(b.out, "warning: %s %s, %s: %d answers other than 201 or errors: %v, %d errors\n",
			sp.store(), sp.kind, clients(c), ms.Other, res.Statuses, res.Errors)
	}
	if before.cpuOK && after.cpuOK {
		v := per(micros(after.cpu - before.cpu))
		ms.StoreCPU = &v
	}
	if m.wire != nil {
		rt, bytes := per(float64(after.wire.writes-before.wire.writes)), per(float64(after.wire.bytes-before.wire.bytes))
		ms.RoundTrips, ms.WireBytes = &rt, &bytes
	}
	if before.callsOK && after.callsOK {
		v := per(float64(after.calls - before.calls))
		ms.StoreCalls = &v
	}
	return ms, nil
}

// startProfile starts a CPU profile of the phase if asked to, and returns
// what stops it.
func (b *bench) startProfile(sp phaseSpec, first bool) (func(), error) {
	if b.cfg.profile == "" || !first {
		return func() {}, nil
	}
	f, err := os.Create(b.cfg.profile + "-" + sp.store() + "-" + sp.kind + ".pprof")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// newMeasure returns what the load generator measured of a phase, with
// serverCPU, the serving process's CPU time during it.
func newMeasure(res result, serverCPU time.Duration) benchreport.Measure {
	per := func(x float64) float64 { return x / float64(res.Requests) }
	return benchreport.Measure{
		Requests:  res.Requests,
		OK:        res.ok(),
		Other:     res.Requests - res.ok() + res.Errors,
		Seconds:   res.Seconds,
		PerSecond: float64(res.ok()) / res.Seconds,
		P50:       micros(res.P50),
		P99:       micros(res.P99),
		ServerCPU: per(micros(serverCPU)),
		LoadCPU:   per(micros(res.CPU)),
	}
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
