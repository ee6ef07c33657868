package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

var update = flag.Bool("update", false, "rewrite the golden charts in testdata from the reports there")

// The reports in testdata are short runs of loadbench: one against
// concurrency, one against records held, with sizes and sweeps.
var fixtures = []string{"concurrency", "records"}

func load(t *testing.T, name string) *benchreport.Report {
	t.Helper()
	rep, err := readReport(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// Each report gives the charts it has numbers for, byte for byte those in
// testdata (go test -update rewrites them after a deliberate change).
func TestRenderGolden(t *testing.T) {
	want := map[string][]string{
		"concurrency": {"throughput", "p50", "p99", "cpu", "store-cpu"},
		"records":     {"throughput", "p50", "p99", "cpu", "store-cpu", "sizes", "sweep"},
	}
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			charts, err := render(load(t, name))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range charts {
				got = append(got, c.name)
				path := filepath.Join("testdata", "golden", name+"-"+c.name+".svg")
				if *update {
					if err := os.WriteFile(path, c.svg, 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				golden, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (go test -update writes it)", err)
				}
				if !bytes.Equal(c.svg, golden) {
					t.Errorf("%s differs from %s (go test -update rewrites it)", c.name, path)
				}
			}
			if strings.Join(got, ",") != strings.Join(want[name], ",") {
				t.Errorf("charts = %v, want %v", got, want[name])
			}
		})
	}
}

// The same report, also after a trip through its JSON, gives the same bytes.
func TestRenderDeterministic(t *testing.T) {
	for _, name := range fixtures {
		rep := load(t, name)
		first, err := render(rep)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := rep.Write(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := benchreport.Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			second, err := render(again)
			if err != nil {
				t.Fatal(err)
			}
			if len(second) != len(first) {
				t.Fatalf("%s: %d charts, then %d", name, len(first), len(second))
			}
			for i := range first {
				if !bytes.Equal(first[i].svg, second[i].svg) {
					t.Errorf("%s: chart %s differs between two renderings", name, first[i].name)
				}
			}
		}
	}
}

// Every chart is well-formed XML with an svg root, and has no NaN or
// infinite coordinate.
func TestRenderWellFormed(t *testing.T) {
	for _, name := range fixtures {
		charts, err := render(load(t, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range charts {
			d := xml.NewDecoder(bytes.NewReader(c.svg))
			root := ""
			for {
				tok, err := d.Token()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("%s-%s: %v", name, c.name, err)
				}
				if se, ok := tok.(xml.StartElement); ok && root == "" {
					root = se.Name.Local
				}
			}
			if root != "svg" {
				t.Errorf("%s-%s: root element %q, want svg", name, c.name, root)
			}
			for _, bad := range []string{"NaN", "Inf"} {
				if bytes.Contains(c.svg, []byte(bad)) {
					t.Errorf("%s-%s: contains %s", name, c.name, bad)
				}
			}
		}
	}
}

// A measure that no phase has draws no chart; a phase missing at one level
// breaks its line rather than drawing it through zero.
func TestRenderMissing(t *testing.T) {
	rep := load(t, "concurrency")
	var kept []benchreport.Phase
	for _, p := range rep.Phases {
		p.Median.StoreCPU = nil
		if p.Store == benchreport.Redis && p.Concurrency == 8 {
			continue
		}
		kept = append(kept, p)
	}
	rep.Phases = kept
	charts, err := render(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range charts {
		if c.name == "store-cpu" {
			t.Error("a store-cpu chart without any store CPU measure")
		}
		if c.name == "throughput" {
			// Redis's two lines are broken at 8 clients: no polyline
			// for them, only their points.
			if n := strings.Count(string(c.svg), `<polyline fill="none" stroke="`+palette["redis"]); n != 0 {
				t.Errorf("throughput: %d Redis lines across a missing level, want 0", n)
			}
		}
	}
}

func TestWriteTables(t *testing.T) {
	rep := load(t, "records")
	var buf bytes.Buffer
	if err := writeTables(&buf, rep); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	rows := 0
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| phase") && !strings.HasPrefix(line, "| store") {
			rows++
		}
	}
	want := len(rep.Phases)
	for _, s := range rep.Sizes {
		want += len(s.Items)
	}
	for _, s := range rep.Sweeps {
		want += len(s.Windows)
	}
	if rows != want {
		t.Errorf("writeTables: %d rows, want %d\n%s", rows, want, out)
	}
	if !strings.HasPrefix(out, "`"+rep.Command+"`") {
		t.Errorf("writeTables does not begin with the command:\n%s", out)
	}
}

func TestLabel(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "0"}, {0.5, "0.5"}, {2, "2"}, {12, "12"}, {1000, "1k"}, {1500, "1.5k"},
		{10000, "10k"}, {1_000_000, "1M"}, {2_500_000, "2.5M"},
	} {
		if got := label(tc.v); got != tc.want {
			t.Errorf("label(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestScale(t *testing.T) {
	sc := newScale([]float64{3, 17, 42}, false)
	if sc.lo != 0 || sc.hi != 50 {
		t.Errorf("linear scale of 3..42 = [%v, %v], want [0, 50]", sc.lo, sc.hi)
	}
	if y0, y1 := sc.y(0), sc.y(50); y0 != top+plotH || y1 != top {
		t.Errorf("y(0), y(50) = %v, %v; want the bottom %v and the top %v", y0, y1, top+plotH, top)
	}
	// A difference from bare can be negative: the axis goes below zero.
	neg := newScale([]float64{-3, 12}, false)
	if neg.lo != -5 || neg.hi != 15 {
		t.Errorf("linear scale of -3..12 = [%v, %v], want [-5, 15]", neg.lo, neg.hi)
	}
	if y := neg.y(-3); y > top+plotH || y < top {
		t.Errorf("y(-3) = %v, outside the plot [%v, %v]", y, top, top+plotH)
	}
	lg := newScale([]float64{150, 23000}, true)
	if lg.lo != 100 || lg.hi != 100000 {
		t.Errorf("log scale of 150..23000 = [%v, %v], want [100, 100000]", lg.lo, lg.hi)
	}
	if ticks := lg.ticks(); len(ticks) != 10 || ticks[1] != 200 {
		t.Errorf("log ticks = %v, want 1, 2, 5 of each power of ten", ticks)
	}
}
