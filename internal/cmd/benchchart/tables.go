package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// writeTables prints the report's medians, sizes and sweeps as Markdown
// tables.
func writeTables(w io.Writer, rep *benchreport.Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "`%s`\n", rep.Command)
	type level struct{ records, concurrency int }
	var levels []level
	for _, p := range rep.Phases {
		if l := (level{p.Records, p.Concurrency}); !slices.Contains(levels, l) {
			levels = append(levels, l)
		}
	}
	for _, l := range levels {
		fmt.Fprintf(&b, "\n%s records held, %s (medians of %d rounds; µs per request)\n\n", label(float64(l.records)), clients(l.concurrency), rep.Settings.Rounds)
		b.WriteString("| phase | req/s | × bare | p50 µs | p99 µs | server CPU | over bare | store CPU | round trips | store calls |\n")
		b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, p := range rep.Phases {
			if p.Records != l.records || p.Concurrency != l.concurrency {
				continue
			}
			m := p.Median
			name := p.Store
			if p.Kind != benchreport.KindBare {
				name += " " + p.Kind
			}
			fmt.Fprintf(&b, "| %s | %.0f | %s | %.0f | %.0f | %.1f | %s | %s | %s | %s |\n",
				name, m.PerSecond, opt(m.PerSecondVsBare, "%.2f"), m.P50, m.P99, m.ServerCPU,
				opt(m.ServerCPUOverBare, "%+.1f"), opt(m.StoreCPU, "%.1f"), opt(m.RoundTrips, "%.3f"), opt(m.StoreCalls, "%.3f"))
		}
	}
	if len(rep.Sizes) > 0 {
		b.WriteString("\n| store | records | what | bytes per record |\n|---|--:|---|--:|\n")
		for _, s := range rep.Sizes {
			for _, it := range s.Items {
				fmt.Fprintf(&b, "| %s | %s | %s | %.0f |\n", s.Store, label(float64(s.Records)), it.What, it.BytesPerRecord)
			}
		}
	}
	if len(rep.Sweeps) > 0 {
		b.WriteString("\n| store | expired | removed by | removed | in s | per second | window | claims | claim p50 µs | claim p99 µs | claim max µs | req/s | p99 µs |\n")
		b.WriteString("|---|--:|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|\n")
		for _, s := range rep.Sweeps {
			for i, win := range s.Windows {
				head := fmt.Sprintf("| %s | %s | %s | %d | %.2f | %.0f ", s.Store, label(float64(s.Expired)), s.How, s.Removed, s.Seconds, s.RowsPerSecond)
				if i > 0 {
					head = "| | | | | | "
				}
				fmt.Fprintf(&b, "%s| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f |\n",
					head, win.Name, win.Claims, win.ClaimP50, win.ClaimP99, win.ClaimMax, win.PerSecond, win.P99)
			}
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// opt formats a measure that may be missing.
func opt(v *float64, format string) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf(format, *v)
}

// clients says how many concurrent clients.
func clients(n int) string {
	if n == 1 {
		return "1 client"
	}
	return strconv.Itoa(n) + " clients"
}
