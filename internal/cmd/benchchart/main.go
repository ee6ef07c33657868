// Command benchchart draws the charts of BENCHMARKS.md from the JSON that
// internal/cmd/loadbench writes, so that they are redrawn from the numbers,
// never edited by hand:
//
//	go run ./internal/cmd/benchchart -out docs/benchmarks docs/benchmarks/concurrency.json docs/benchmarks/records.json
//
// For each report r.json it writes SVG files named r-*.svg: throughput,
// latencies (p50, p99) and CPU time per request (this process over the bare
// handler, and the store server) against the level that the report varies
// (concurrency, or else the records held); the bytes a record costs each
// store; and the Claim latencies around a removal of expired records. With
// -markdown it also prints the report's tables, in Markdown. The same report
// always gives the same bytes.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

func main() {
	log.SetFlags(0)
	out := flag.String("out", ".", "directory to write the charts to")
	markdown := flag.Bool("markdown", false, "also print each report's tables, in Markdown, to the standard output")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchchart [-out dir] [-markdown] report.json...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	for _, in := range flag.Args() {
		rep, err := readReport(in)
		if err != nil {
			log.Fatalf("benchchart: %s: %v", in, err)
		}
		base := strings.TrimSuffix(filepath.Base(in), filepath.Ext(in))
		charts, err := render(rep)
		if err != nil {
			log.Fatalf("benchchart: %s: %v", in, err)
		}
		for _, c := range charts {
			path := filepath.Join(*out, base+"-"+c.name+".svg")
			if err := os.WriteFile(path, c.svg, 0o644); err != nil {
				log.Fatalf("benchchart: %v", err)
			}
			fmt.Fprintln(os.Stderr, "wrote", path)
		}
		if *markdown {
			if err := writeTables(os.Stdout, rep); err != nil {
				log.Fatalf("benchchart: %v", err)
			}
		}
	}
}

func readReport(path string) (*benchreport.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return benchreport.Read(f)
}

// chart is a rendered chart and its name.
type chart struct {
	name string
	svg  []byte
}

// render draws every chart that the report has the numbers for.
func render(rep *benchreport.Report) ([]chart, error) {
	var charts []chart
	add := func(name string, draw func(io.Writer) error) error {
		var b bytes.Buffer
		if err := draw(&b); err != nil {
			return err
		}
		charts = append(charts, chart{name, b.Bytes()})
		return nil
	}
	if len(rep.Phases) > 0 {
		ax := levelAxis(rep)
		for _, m := range []struct {
			name, title, unit string
			value             func(benchreport.Measure) *float64
			log, bare         bool
		}{
			{"throughput", "Requests per second", "requests per second", func(m benchreport.Measure) *float64 { return &m.PerSecond }, false, true},
			{"p50", "Median latency (p50)", "µs, log scale", func(m benchreport.Measure) *float64 { return &m.P50 }, true, true},
			{"p99", "Tail latency (p99)", "µs, log scale", func(m benchreport.Measure) *float64 { return &m.P99 }, true, true},
			{"cpu", "Server process CPU per request, over bare", "µs per request", func(m benchreport.Measure) *float64 { return m.ServerCPUOverBare }, false, false},
			{"store-cpu", "Store server CPU per request", "µs per request", func(m benchreport.Measure) *float64 { return m.StoreCPU }, false, false},
		} {
			ss := ax.series(rep, m.value, m.bare)
			if len(ss) == 0 {
				continue
			}
			title := m.title + ax.suffix
			if err := add(m.name, func(w io.Writer) error {
				return lineChart(w, title, m.unit, ax.label, ax.categories, ss, m.log)
			}); err != nil {
				return nil, err
			}
		}
	}
	if len(rep.Sizes) > 0 {
		if err := add("sizes", func(w io.Writer) error { return sizesChart(w, rep.Sizes) }); err != nil {
			return nil, err
		}
	}
	if len(rep.Sweeps) > 0 {
		if err := add("sweep", func(w io.Writer) error { return sweepChart(w, rep.Sweeps) }); err != nil {
			return nil, err
		}
	}
	return charts, nil
}
