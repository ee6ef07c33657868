package main

import (
	"io"
	"math"
	"slices"
	"strconv"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// axis is the level a report's charts are drawn against: the concurrency if
// the report has several, or else the records held.
type axis struct {
	byConcurrency bool
	levels        []int
	// fixed is the other level, at which the charts are drawn.
	fixed      int
	categories []string
	label      string
	suffix     string
}

func levelAxis(rep *benchreport.Report) axis {
	var conc, recs []int
	for _, p := range rep.Phases {
		if !slices.Contains(conc, p.Concurrency) {
			conc = append(conc, p.Concurrency)
		}
		if !slices.Contains(recs, p.Records) {
			recs = append(recs, p.Records)
		}
	}
	slices.Sort(conc)
	slices.Sort(recs)
	a := axis{byConcurrency: len(conc) > 1 || len(recs) <= 1}
	if a.byConcurrency {
		a.levels, a.fixed = conc, recs[0]
		a.label = "concurrent clients"
		a.suffix = " (" + label(float64(a.fixed)) + " records held)"
		for _, c := range conc {
			a.categories = append(a.categories, strconv.Itoa(c))
		}
	} else {
		a.levels, a.fixed = recs, conc[0]
		a.label = "records held"
		a.suffix = " (" + clients(a.fixed) + ")"
		for _, r := range recs {
			a.categories = append(a.categories, label(float64(r)))
		}
	}
	return a
}

// find returns the phase of store and kind at level.
func (a axis) find(rep *benchreport.Report, level int, store, kind string) *benchreport.Phase {
	if a.byConcurrency {
		return rep.Find(a.fixed, level, store, kind)
	}
	return rep.Find(level, a.fixed, store, kind)
}

// series returns a line for each store and kind, in the order they first
// appear in the report, with value's median at each level; the bare handler
// only with bare. Lines without a value are left out.
func (a axis) series(rep *benchreport.Report, value func(benchreport.Measure) *float64, bare bool) []series {
	type sk struct{ store, kind string }
	var order []sk
	for _, p := range rep.Phases {
		k := sk{p.Store, p.Kind}
		if !slices.Contains(order, k) && (bare || p.Store != benchreport.Bare) {
			order = append(order, k)
		}
	}
	var out []series
	for i, k := range order {
		sr := series{name: k.store, color: colorOf(k.store, i), dashed: k.kind == benchreport.KindReplay}
		if k.kind != benchreport.KindBare {
			sr.name += " " + k.kind
		}
		any := false
		for _, l := range a.levels {
			v := math.NaN()
			if p := a.find(rep, l, k.store, k.kind); p != nil {
				if x := value(p.Median); x != nil {
					v, any = *x, true
				}
			}
			sr.values = append(sr.values, v)
		}
		if any {
			out = append(out, sr)
		}
	}
	return out
}

// sizesChart draws the bytes per record of each store at each level.
func sizesChart(w io.Writer, sizes []benchreport.Size) error {
	var names []string
	for _, s := range sizes {
		for _, it := range s.Items {
			if !slices.Contains(names, it.What) {
				names = append(names, it.What)
			}
		}
	}
	var groups []string
	var bars [][]bar
	for _, s := range sizes {
		groups = append(groups, s.Store+", "+label(float64(s.Records)))
		var g []bar
		for _, it := range s.Items {
			parts := nanParts(len(names))
			parts[slices.Index(names, it.What)] = it.BytesPerRecord
			g = append(g, bar{label: strconv.FormatFloat(it.BytesPerRecord, 'f', 0, 64), parts: parts})
		}
		bars = append(bars, g)
	}
	return barChart(w, "Bytes per record (1 KiB response body)", "bytes per record", groups, bars, names, extra, false)
}

// sweepChart draws the Claim p99 before, during and after each removal of
// expired records.
func sweepChart(w io.Writer, sweeps []benchreport.Sweep) error {
	var names []string
	for _, s := range sweeps {
		for _, win := range s.Windows {
			if !slices.Contains(names, win.Name) {
				names = append(names, win.Name)
			}
		}
	}
	var groups []string
	var bars [][]bar
	for _, s := range sweeps {
		groups = append(groups, s.Store+", "+label(float64(s.Expired))+" expired")
		var g []bar
		for _, win := range s.Windows {
			parts := nanParts(len(names))
			parts[slices.Index(names, win.Name)] = win.ClaimP99
			g = append(g, bar{label: strconv.FormatFloat(win.ClaimP99, 'f', 0, 64), parts: parts})
		}
		bars = append(bars, g)
	}
	return barChart(w, "Claim p99 around the removal of expired records", "µs, log scale", groups, bars, names,
		[]string{"#1b9e77", "#d95f02", "#7570b3"}, true)
}

func nanParts(n int) []float64 {
	p := make([]float64, n)
	for i := range p {
		p[i] = math.NaN()
	}
	return p
}
