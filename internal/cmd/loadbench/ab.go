package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// The A/B mode (-ab REV, -peer-dir DIR) compares servers that are separate
// programs: this tree's, a git revision's, the peer's, and the minimal
// statements (abserver -minimal). Each variant, on each store, is a server
// process of its own, started for the run; this process runs none of the
// load and serves nothing, it builds the servers, starts them, drives the
// load generator and measures. Every round runs each (variant, store, kind)
// phase once, in an order shuffled each round (the variants of a store and
// kind one after the other), and the comparisons are this tree's measures
// over each other variant's in the same round; the report gives each
// ratio's median and range over the rounds.

// Names of the variants other than a revision, which is named as given.
const (
	variantThis    = "this"
	variantPeer    = "peer"
	variantMinimal = "minimal"
)

// abVariant is one server program of an A/B run.
type abVariant struct {
	info benchreport.Variant
	bin  string
	// args are added to every start: -minimal.
	args []string
	// tag names the variant's PostgreSQL table.
	tag string
}

func (v *abVariant) minimal() bool { return v.info.Source == benchreport.VariantMinimal }

// abTarget is a variant's server on one store.
type abTarget struct {
	v     *abVariant
	store string
	proc  *serverProc
	st    abStore
}

func (t *abTarget) name() string { return t.store + " " + t.v.info.Name }

// abStore is what the run does to a target's store, outside the server.
type abStore interface {
	// fill makes the store hold n copies of the replayed key's record and
	// that record, and nothing else.
	fill(ctx context.Context, n int) error
	// clean removes what a phase of first executions added.
	clean(ctx context.Context) error
	// cpu returns the store server's CPU time, false when it cannot be
	// read; calls its count of calls, false when unknown.
	cpu(ctx context.Context) (time.Duration, bool)
	calls(ctx context.Context) (int64, bool)
	close()
}

// abRun is one run of the A/B mode.
type abRun struct {
	cfg       config
	out       io.Writer
	gen       *loadgen
	client    *http.Client
	replayKey string
	// id names this run's tables.
	id       string
	variants []*abVariant
	targets  []*abTarget
	pg       *abPostgres
}

// abSpec names a phase of a round.
type abSpec struct {
	t    *abTarget
	kind string
}

// runAB runs the A/B mode that cfg describes.
func runAB(ctx context.Context, cfg config, out io.Writer, newGen func() (*loadgen, error)) (rep *benchreport.Report, err error) {
	r := &abRun{cfg: cfg, out: out, replayKey: "replay-" + randomHex(6), id: randomHex(4)}
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

	dir, err := os.MkdirTemp("", "loadbench-ab-")
	if err != nil {
		return nil, fmt.Errorf("loadbench: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := r.build(dir); err != nil {
		return nil, err
	}
	for _, v := range r.variants {
		rep.Variants = append(rep.Variants, v.info)
	}

	tr := &http.Transport{MaxIdleConnsPerHost: 2}
	defer tr.CloseIdleConnections()
	r.client = &http.Client{Transport: tr, Timeout: 10 * time.Minute}
	if r.gen, err = newGen(); err != nil {
		return nil, err
	}
	defer r.gen.close()
	defer r.close()
	for _, store := range cfg.stores {
		if err := r.start(ctx, rep, store); err != nil {
			return nil, err
		}
	}
	var names []string
	for _, v := range r.variants {
		names = append(names, v.info.Name)
	}
	fmt.Fprintf(out, "variants %s; stores %s; concurrency %v; records %v; %d rounds of %v per phase; 1 KiB bodies; load %.2f %.2f %.2f\n",
		strings.Join(names, ", "), strings.Join(cfg.stores, ", "), cfg.concurrency, cfg.records, cfg.rounds, cfg.duration,
		rep.Machine.LoadBefore[0], rep.Machine.LoadBefore[1], rep.Machine.LoadBefore[2])
	for _, n := range cfg.records {
		if err := r.level(ctx, rep, n); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// build builds every variant's server program into dir.
func (r *abRun) build(dir string) error {
	start := time.Now()
	b, err := newBuilder(dir, r.out)
	if err != nil {
		return err
	}
	bin, info, err := b.tree()
	if err != nil {
		return err
	}
	this := &abVariant{info: info, bin: bin, tag: "this"}
	r.variants = append(r.variants, this)
	if rev := r.cfg.ab; rev != "" {
		name := rev
		if name == variantThis || name == variantPeer || name == variantMinimal {
			name = "rev-" + name
		}
		bin, info, err := b.revision(rev, name)
		if err != nil {
			return err
		}
		r.variants = append(r.variants, &abVariant{info: info, bin: bin, tag: "rev"})
	}
	if r.cfg.peerDir != "" {
		bin, info, err := b.peer(r.cfg.peerDir)
		if err != nil {
			return err
		}
		r.variants = append(r.variants, &abVariant{info: info, bin: bin, tag: "peer"})
	}
	if r.cfg.minimal {
		r.variants = append(r.variants, &abVariant{
			info: benchreport.Variant{Name: variantMinimal, Source: benchreport.VariantMinimal, Commit: this.info.Commit, Built: "this tree's abserver -minimal"},
			bin:  this.bin, args: []string{"-minimal"}, tag: "min",
		})
	}
	fmt.Fprintf(r.out, "built the servers in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// start starts every variant's server on store, and readies the store.
func (r *abRun) start(ctx context.Context, rep *benchreport.Report, store string) error {
	if store == benchreport.Postgres && r.pg == nil {
		pg, err := newABPostgres(ctx, r.id, r.cfg.syncCommit)
		if err != nil {
			return err
		}
		r.pg = pg
		rep.Machine.Postgres = pg.version
		rep.Settings.PostgresCPU = "none: the server is not on this machine"
		if pg.local {
			rep.Settings.PostgresCPU = "the backends serving each server's pool"
		}
	}
	for _, v := range r.variants {
		t := &abTarget{v: v, store: store}
		args := append([]string{"-store", store, "-pool", strconv.Itoa(r.cfg.pool)}, v.args...)
		var (
			env []string
			err error
		)
		switch store {
		case benchreport.Memory:
			t.st = noStore{}
		case benchreport.Postgres:
			var pt *abPostgresTable
			if pt, err = r.pg.table(v.tag); err == nil {
				t.st = pt
				args = append(args, "-table", pt.name)
				env = append(env, "IDEMPOTENCY_POSTGRES_URL="+pt.url)
			}
		case benchreport.Redis:
			var rs *abRedis
			if rs, err = newABRedis(ctx); err == nil {
				t.st = rs
				rep.Machine.Redis = rs.version
				rep.Settings.RedisServer = "own, one for each variant"
				args = append(args, "-redis-url", "redis://"+rs.own.addr+"/0", "-prefix", "loadbench:")
			}
		}
		if err == nil {
			// Closed by r.close from now on, whatever happens next.
			r.targets = append(r.targets, t)
			t.proc, err = startServer(ctx, r.client, v.bin, args, env)
		}
		if err == nil && store != benchreport.Memory {
			err = r.seed(ctx, t)
		}
		if err != nil {
			return fmt.Errorf("loadbench: %s: %w", t.name(), err)
		}
	}
	return nil
}

// seed completes the replayed key's record through the server, and tells
// the store which record that is.
func (r *abRun) seed(ctx context.Context, t *abTarget) error {
	if _, err := t.proc.control(ctx, "open", nil); err != nil {
		return err
	}
	if t.v.minimal() {
		if _, err := t.proc.control(ctx, "kind", url.Values{"kind": {benchreport.KindFirst}}); err != nil {
			return err
		}
	}
	if err := t.proc.seed(ctx, r.replayKey); err != nil {
		return err
	}
	if _, err := t.proc.control(ctx, "close", nil); err != nil {
		return err
	}
	switch st := t.st.(type) {
	case *abPostgresTable:
		return st.seeded(ctx, r.replayKey)
	case *abRedis:
		return st.seeded(ctx, r.replayKey)
	}
	return nil
}

// close stops the servers and removes what the run stored.
func (r *abRun) close() {
	for _, t := range r.targets {
		if t.proc != nil {
			t.proc.stop()
		}
		if t.st != nil {
			t.st.close()
		}
	}
	if r.pg != nil {
		r.pg.close()
	}
}

// level runs every round at one number of records held.
func (r *abRun) level(ctx context.Context, rep *benchreport.Report, n int) error {
	fmt.Fprintf(r.out, "\n== %d records\n", n)
	for _, t := range r.targets {
		if err := t.st.fill(ctx, n); err != nil {
			return fmt.Errorf("loadbench: filling %s with %d records: %w", t.name(), n, err)
		}
	}
	var specs []abSpec
	for _, t := range r.targets {
		specs = append(specs, abSpec{t, benchreport.KindFirst}, abSpec{t, benchreport.KindReplay})
	}
	// A short unmeasured run of every phase first, so that what happens
	// once (loaded functions, the plans of prepared statements, the
	// servers' heaps) is not in the first round.
	for _, sp := range specs {
		if _, err := r.phase(ctx, sp, n, slices.Max(r.cfg.concurrency), min(r.cfg.duration, time.Second)); err != nil {
			return fmt.Errorf("loadbench: warming up %s %s: %w", sp.t.name(), sp.kind, err)
		}
	}
	phases := map[string]*benchreport.Phase{}
	var order []string
	ratios := map[ratioKey]*ratioRounds{}
	var ratioOrder []ratioKey
	for round := range r.cfg.rounds {
		for _, c := range r.cfg.concurrency {
			measures := map[abSpec]benchreport.Measure{}
			for _, sp := range shuffle(specs) {
				if err := ctx.Err(); err != nil {
					return err
				}
				m, err := r.phase(ctx, sp, n, c, r.cfg.duration)
				if err != nil {
					return fmt.Errorf("loadbench: %s %s, %s: %w", sp.t.name(), sp.kind, clients(c), err)
				}
				measures[sp] = m
			}
			var line []string
			for _, sp := range specs {
				key := fmt.Sprintf("%d/%s/%s", c, sp.t.name(), sp.kind)
				p, ok := phases[key]
				if !ok {
					p = &benchreport.Phase{Records: n, Concurrency: c, Store: sp.t.name(), Variant: sp.t.v.info.Name, Kind: sp.kind}
					phases[key] = p
					order = append(order, key)
				}
				p.Rounds = append(p.Rounds, measures[sp])
				if sp.t.v == r.variants[0] {
					continue
				}
				this := measures[abSpec{r.target(sp.t.store, r.variants[0]), sp.kind}]
				k := ratioKey{c, sp.t.store, sp.kind, sp.t.v.info.Name}
				rr, ok := ratios[k]
				if !ok {
					rr = &ratioRounds{}
					ratios[k] = rr
					ratioOrder = append(ratioOrder, k)
				}
				rr.add(this, measures[sp])
				line = append(line, fmt.Sprintf("%s %s ÷%s %.2f/%.2f", sp.t.store, sp.kind, sp.t.v.info.Name,
					last(rr.perSecond), last(rr.serverCPU)))
			}
			fmt.Fprintf(r.out, "round %d, %s (this ÷ other: req/s, server CPU): %s\n", round+1, clients(c), strings.Join(line, ", "))
		}
	}
	var done []benchreport.Phase
	for _, key := range order {
		p := phases[key]
		p.Summarize()
		done = append(done, *p)
	}
	rep.Phases = append(rep.Phases, done...)
	var comps []benchreport.Comparison
	for _, k := range ratioOrder {
		rr := ratios[k]
		comps = append(comps, benchreport.Comparison{
			Records: n, Concurrency: k.c, Store: k.store, Kind: k.kind, Over: k.over,
			PerSecond: benchreport.NewRatio(rr.perSecond),
			ServerCPU: benchreport.NewRatio(rr.serverCPU),
			StoreCPU:  benchreport.NewRatio(rr.storeCPU),
		})
	}
	rep.Comparisons = append(rep.Comparisons, comps...)
	printLevel(r.out, n, r.cfg, done)
	printRatios(r.out, n, r.cfg, comps)
	return nil
}

// shuffle returns the phases of a round in a random order in which the
// variants of each store and kind run one after the other (in a random
// order too): a ratio is taken between phases minutes apart otherwise, and
// the load of a shared machine moves within minutes.
func shuffle(specs []abSpec) []abSpec {
	type group struct{ store, kind string }
	var order []group
	byGroup := map[group][]abSpec{}
	for _, sp := range specs {
		g := group{sp.t.store, sp.kind}
		if _, ok := byGroup[g]; !ok {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], sp)
	}
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	out := make([]abSpec, 0, len(specs))
	for _, g := range order {
		in := slices.Clone(byGroup[g])
		rand.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		out = append(out, in...)
	}
	return out
}

// target returns v's target on store.
func (r *abRun) target(store string, v *abVariant) *abTarget {
	for _, t := range r.targets {
		if t.store == store && t.v == v {
			return t
		}
	}
	return nil
}

// ratioKey names a comparison.
type ratioKey struct {
	c                 int
	store, kind, over string
}

// ratioRounds are a comparison's ratios, one for each round.
type ratioRounds struct {
	perSecond, serverCPU, storeCPU []float64
}

// add adds the ratios of this tree's measure over another's.
func (rr *ratioRounds) add(this, other benchreport.Measure) {
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return math.NaN()
		}
		return a / b
	}
	rr.perSecond = append(rr.perSecond, ratio(this.PerSecond, other.PerSecond))
	rr.serverCPU = append(rr.serverCPU, ratio(this.ServerCPU, other.ServerCPU))
	if this.StoreCPU != nil && other.StoreCPU != nil {
		rr.storeCPU = append(rr.storeCPU, ratio(*this.StoreCPU, *other.StoreCPU))
	}
}

func last(v []float64) float64 { return v[len(v)-1] }

// abReading is what a phase reads before and after.
type abReading struct {
	server, store  time.Duration
	serverOK, stOK bool
	stats          serverStats
	calls          int64
	callsOK        bool
}

func (r *abRun) read(ctx context.Context, t *abTarget) (abReading, error) {
	var rd abReading
	var err error
	rd.server, rd.serverOK = readProcCPU(t.proc.pid())
	if rd.stats, err = t.proc.control(ctx, "stats", nil); err != nil {
		return rd, err
	}
	rd.store, rd.stOK = t.st.cpu(ctx)
	rd.calls, rd.callsOK = t.st.calls(ctx)
	return rd, nil
}

// phase readies a target's server and store for a phase, runs it for d
// and measures it.
func (r *abRun) phase(ctx context.Context, sp abSpec, n, c int, d time.Duration) (benchreport.Measure, error) {
	t := sp.t
	key := ""
	if sp.kind == benchreport.KindReplay {
		key = r.replayKey
	}
	j := job{URL: t.proc.url + "/orders", Key: key, Concurrency: c, Seconds: d.Seconds()}
	if t.store == benchreport.Memory {
		// The records live in the server: a store of this level's records
		// for every phase, so that the collector's work does not grow
		// from one phase to the next.
		if _, err := t.proc.control(ctx, "reset", url.Values{"records": {strconv.Itoa(n)}}); err != nil {
			return benchreport.Measure{}, err
		}
		// A new store of the minimal statements takes the path of first
		// executions until told otherwise.
		if err := t.proc.seed(ctx, r.replayKey); err != nil {
			return benchreport.Measure{}, err
		}
	}
	if t.v.minimal() {
		if _, err := t.proc.control(ctx, "kind", url.Values{"kind": {sp.kind}}); err != nil {
			return benchreport.Measure{}, err
		}
	}
	if t.store == benchreport.Postgres {
		// The pool's connections are new: a short run first prepares
		// their statements, past the executions after which PostgreSQL
		// keeps a generic plan.
		if _, err := t.proc.control(ctx, "open", nil); err != nil {
			return benchreport.Measure{}, err
		}
		t.st.(*abPostgresTable).newPhase()
		warm := j
		warm.Seconds = min(d/2, 500*time.Millisecond).Seconds()
		if _, err := r.gen.run(warm); err != nil {
			return benchreport.Measure{}, err
		}
	}
	if _, err := t.proc.control(ctx, "gc", nil); err != nil {
		return benchreport.Measure{}, err
	}
	before, err := r.read(ctx, t)
	if err != nil {
		return benchreport.Measure{}, err
	}
	res, err := r.gen.run(j)
	if err != nil {
		return benchreport.Measure{}, err
	}
	after, err := r.read(ctx, t)
	if err != nil {
		return benchreport.Measure{}, err
	}
	if t.store == benchreport.Postgres {
		if _, err := t.proc.control(ctx, "close", nil); err != nil {
			return benchreport.Measure{}, err
		}
	}
	if sp.kind == benchreport.KindFirst {
		if err := t.st.clean(ctx); err != nil {
			return benchreport.Measure{}, fmt.Errorf("removing the phase's records: %w", err)
		}
	}
	if res.Requests == 0 {
		return benchreport.Measure{}, fmt.Errorf("no answers (%d transport errors)", res.Errors)
	}
	if !before.serverOK || !after.serverOK {
		return benchreport.Measure{}, fmt.Errorf("the server's CPU time cannot be read from /proc/%d", t.proc.pid())
	}
	ms := newMeasure(res, after.server-before.server)
	if ms.Other > 0 {
		fmt.Fprintf(r.out, "warning: %s %s, %s: %d answers other than 201 or errors: %v, %d errors\n",
			t.name(), sp.kind, clients(c), ms.Other, res.Statuses, res.Errors)
	}
	per := func(x float64) float64 { return x / float64(res.Requests) }
	if before.stOK && after.stOK {
		v := per(micros(after.store - before.store))
		ms.StoreCPU = &v
	}
	if t.store != benchreport.Memory {
		rt := per(float64(after.stats.Writes - before.stats.Writes))
		bytes := per(float64(after.stats.Bytes - before.stats.Bytes))
		ms.RoundTrips, ms.WireBytes = &rt, &bytes
	}
	if before.callsOK && after.callsOK {
		v := per(float64(after.calls - before.calls))
		ms.StoreCalls = &v
	}
	return ms, nil
}

// noStore is memory's: the records live in the server, which replaces its
// store before each phase.
type noStore struct{}

func (noStore) fill(context.Context, int) error           { return nil }
func (noStore) clean(context.Context) error               { return nil }
func (noStore) cpu(context.Context) (time.Duration, bool) { return 0, false }
func (noStore) calls(context.Context) (int64, bool)       { return 0, false }
func (noStore) close()                                    {}
