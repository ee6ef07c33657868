package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// The rounds of the A/B mode, its phases, and its ratios.

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
				k := ratioKey{c: c, store: sp.t.store, kind: sp.kind, over: sp.t.v.info.Name}
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
			// The floor: the minimal statements over the peer, what no
			// middleware in this harness can pass by a wider margin.
			for _, sp := range specs {
				floor, peer := r.named(sp.t.store, variantMinimal), r.named(sp.t.store, variantPeer)
				if sp.t != floor || peer == nil {
					continue
				}
				k := ratioKey{c: c, store: sp.t.store, kind: sp.kind, over: variantPeer, of: variantMinimal}
				rr, ok := ratios[k]
				if !ok {
					rr = &ratioRounds{}
					ratios[k] = rr
					ratioOrder = append(ratioOrder, k)
				}
				rr.add(measures[sp], measures[abSpec{peer, sp.kind}])
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
			Records: n, Concurrency: k.c, Store: k.store, Kind: k.kind, Over: k.over, Variant: k.of,
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

// named returns the target of the variant named name on store, nil if the
// run has none.
func (r *abRun) named(store, name string) *abTarget {
	for _, t := range r.targets {
		if t.store == store && t.v.info.Name == name {
			return t
		}
	}
	return nil
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
	// of is the variant divided, "" for this tree.
	of string
}

// ratioRounds are a comparison's ratios, one for each round.
type ratioRounds struct {
	perSecond, serverCPU, storeCPU []float64
}

// add adds the ratios of this tree's measure over another's; a ratio over
// nothing (no time measured) is left out.
func (rr *ratioRounds) add(this, other benchreport.Measure) {
	add := func(to *[]float64, a, b float64) {
		if b > 0 {
			*to = append(*to, a/b)
		}
	}
	add(&rr.perSecond, this.PerSecond, other.PerSecond)
	add(&rr.serverCPU, this.ServerCPU, other.ServerCPU)
	if this.StoreCPU != nil && other.StoreCPU != nil {
		add(&rr.storeCPU, *this.StoreCPU, *other.StoreCPU)
	}
}

// last returns the last ratio, NaN if there is none.
func last(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return v[len(v)-1]
}

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
