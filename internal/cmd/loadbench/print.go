package main

import (
	"cmp"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// printLevel prints the medians of one level's phases, a table for each
// concurrency.
func printLevel(out io.Writer, n int, cfg config, phases []benchreport.Phase) {
	for _, c := range cfg.concurrency {
		fmt.Fprintf(out, "\n%d records, %s: medians of %d rounds (µs are per request)\n", n, clients(c), cfg.rounds)
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "phase\treq/s\t× bare\tp50 µs\tp99 µs\tserver CPU\tover bare\tstore CPU\tround trips\tstore calls\twire B\tloadgen CPU\t")
		for _, p := range phases {
			if p.Concurrency != c {
				continue
			}
			m := p.Median
			name := p.Store
			if p.Kind != benchreport.KindBare {
				name += " " + p.Kind
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%.0f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%.1f\t\n",
				name, m.PerSecond, opt(m.PerSecondVsBare, "%.2f"), m.P50, m.P99, m.ServerCPU,
				opt(m.ServerCPUOverBare, "%+.1f"), opt(m.StoreCPU, "%.1f"), opt(m.RoundTrips, "%.3f"),
				opt(m.StoreCalls, "%.3f"), opt(m.WireBytes, "%.0f"), m.LoadCPU)
		}
		tw.Flush()
	}
}

// printSweep prints a sweep run.
func printSweep(out io.Writer, s benchreport.Sweep) {
	fmt.Fprintf(out, "\n%s: %d expired records, removed by %s: %d in %.2f s (%.0f/s); %s of first executions\n",
		s.Store, s.Expired, s.How, s.Removed, s.Seconds, s.RowsPerSecond, clients(s.Concurrency))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tseconds\tclaims\tclaim p50 µs\tclaim p99 µs\tclaim max µs\treq/s\tp50 µs\tp99 µs\t")
	for _, w := range s.Windows {
		fmt.Fprintf(tw, "%s\t%.2f\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n",
			w.Name, w.Seconds, w.Claims, w.ClaimP50, w.ClaimP99, w.ClaimMax, w.PerSecond, w.P50, w.P99)
	}
	tw.Flush()
}

// opt formats a measure that may be missing.
func opt(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return strings.TrimSpace(fmt.Sprintf(format, *v))
}

// clients says how many concurrent clients.
func clients(n int) string {
	if n == 1 {
		return "1 client"
	}
	return strconv.Itoa(n) + " clients"
}

// printRatios prints an A/B level's comparisons: this tree's measures over
// each other variant's, the median and the range of the rounds' ratios.
func printRatios(out io.Writer, n int, cfg config, comps []benchreport.Comparison) {
	for _, c := range cfg.concurrency {
		fmt.Fprintf(out, "\n%d records, %s: this tree ÷ each other variant (and the minimal statements ÷ the peer: the floor), median (min–max) of %d rounds' ratios\n", n, clients(c), cfg.rounds)
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "store\tkind\tvariant ÷\treq/s\tserver CPU per request\tstore CPU per request\t")
		for _, cp := range comps {
			if cp.Concurrency != c {
				continue
			}
			of := cmp.Or(cp.Variant, "this")
			fmt.Fprintf(tw, "%s\t%s\t%s ÷ %s\t%s\t%s\t%s\t\n", cp.Store, cp.Kind, of, cp.Over, ratio(cp.PerSecond), ratio(cp.ServerCPU), ratio(cp.StoreCPU))
		}
		tw.Flush()
	}
}

// ratio formats a ratio that may be missing.
func ratio(r *benchreport.Ratio) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", r.Median, r.Min, r.Max)
}
