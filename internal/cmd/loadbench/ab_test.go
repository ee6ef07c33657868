package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

var (
	abStores = flag.String("ab.stores", "memory", "stores of TestAB, comma-separated: memory, postgres, redis")
	abPeer   = flag.String("ab.peer-dir", "", "TestAB also compares with the peer whose source is in this directory")
	abStarts = flag.Int("ab.starts", 20, "servers that TestStartServer starts (a race it guards against showed about once in 300)")
)

// The A/B mode end to end, at a tiny size: this tree against HEAD (HEAD's
// own server program, or this tree's on HEAD's packages if HEAD has none)
// and against the minimal statements, on memory by default (-ab.stores for
// the others, -ab.peer-dir for the peer). Every phase answers, and every
// ratio is there, one a round, and finite.
func TestAB(t *testing.T) {
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			servicetest.Unavailable(t, tool, err)
		}
	}
	stores, err := parseStores(*abStores)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		switch s {
		case benchreport.Postgres:
			servicetest.PostgresURL(t)
		case benchreport.Redis:
			if _, err := exec.LookPath("redis-server"); err != nil {
				servicetest.Unavailable(t, "redis-server", err)
			}
		}
	}
	cfg := config{
		stores:      stores,
		concurrency: []int{2},
		records:     []int{20},
		duration:    100 * time.Millisecond,
		rounds:      2,
		pool:        2,
		ab:          "HEAD",
		peerDir:     *abPeer,
		minimal:     true,
	}
	var out bytes.Buffer
	rep, err := runAB(context.Background(), cfg, &out, testLoadgen)
	if err != nil {
		t.Fatalf("runAB: %v\n%s", err, out.String())
	}
	t.Log(out.String())

	want := []benchreport.Variant{
		{Name: variantThis, Source: benchreport.VariantTree},
		{Name: "HEAD", Source: benchreport.VariantRevision},
	}
	if cfg.peerDir != "" {
		want = append(want, benchreport.Variant{Name: variantPeer, Source: benchreport.VariantPeer})
	}
	want = append(want, benchreport.Variant{Name: variantMinimal, Source: benchreport.VariantMinimal})
	var got []benchreport.Variant
	for _, v := range rep.Variants {
		got = append(got, benchreport.Variant{Name: v.Name, Source: v.Source})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("variants = %v, want %v", got, want)
	}
	for _, store := range stores {
		for _, v := range want {
			for _, kind := range []string{benchreport.KindFirst, benchreport.KindReplay} {
				p := rep.Find(20, 2, store+" "+v.Name, kind)
				if p == nil {
					t.Errorf("%s %s %s: no phase", store, v.Name, kind)
					continue
				}
				m := p.Median
				if p.Variant != v.Name || len(p.Rounds) != cfg.rounds || m.OK == 0 || m.Other != 0 || m.ServerCPU <= 0 {
					t.Errorf("%s %s %s: variant %q, %d rounds, %d ok, %d other, server CPU %v µs; want %d rounds, all ok, some CPU",
						store, v.Name, kind, p.Variant, len(p.Rounds), m.OK, m.Other, m.ServerCPU, cfg.rounds)
				}
				if store == benchreport.Memory {
					if m.RoundTrips != nil || m.StoreCPU != nil {
						t.Errorf("%s %s %s: round trips %v, store CPU %v; want neither", store, v.Name, kind, m.RoundTrips, m.StoreCPU)
					}
					continue
				}
				if m.StoreCPU == nil || *m.StoreCPU <= 0 {
					t.Errorf("%s %s %s: store CPU %v, want some", store, v.Name, kind, m.StoreCPU)
				}
				if v.Source == benchreport.VariantPeer {
					continue // the peer's round trips are its own
				}
				rt := 2.0
				if kind == benchreport.KindReplay {
					rt = 1
				}
				if m.RoundTrips == nil || *m.RoundTrips < rt || *m.RoundTrips > rt*1.1 {
					t.Errorf("%s %s %s: %v round trips, want %v (within 10%%)", store, v.Name, kind, m.RoundTrips, rt)
				}
			}
		}
		// This tree over each other variant, and the floor (the minimal
		// statements over the peer) when the run has a peer.
		type comparison struct{ of, over string }
		var comps []comparison
		for _, over := range want[1:] {
			comps = append(comps, comparison{"", over.Name})
		}
		if cfg.peerDir != "" {
			comps = append(comps, comparison{variantMinimal, variantPeer})
		}
		if n := len(rep.Comparisons); n != len(stores)*2*len(comps) {
			t.Errorf("%d comparisons, want %d: %d stores, 2 kinds, %v", n, len(stores)*2*len(comps), len(stores), comps)
		}
		for _, cp := range comps {
			over := benchreport.Variant{Name: cp.over}
			for _, kind := range []string{benchreport.KindFirst, benchreport.KindReplay} {
				i := slices.IndexFunc(rep.Comparisons, func(c benchreport.Comparison) bool {
					return c.Store == store && c.Kind == kind && c.Variant == cp.of && c.Over == cp.over && c.Records == 20 && c.Concurrency == 2
				})
				if i < 0 {
					t.Errorf("%s %s, %q ÷ %s: no comparison", store, kind, cp.of, over.Name)
					continue
				}
				c := rep.Comparisons[i]
				ratios := map[string]*benchreport.Ratio{"req/s": c.PerSecond, "server CPU": c.ServerCPU}
				if store != benchreport.Memory {
					ratios["store CPU"] = c.StoreCPU
				} else if c.StoreCPU != nil {
					t.Errorf("memory %s ÷ %s: a store CPU ratio, %v", kind, over.Name, c.StoreCPU)
				}
				for what, r := range ratios {
					if r == nil || len(r.Rounds) != cfg.rounds || !finite(r.Median) || r.Min > r.Median || r.Median > r.Max {
						t.Errorf("%s %s ÷ %s, %s: %+v; want a finite ratio for each of %d rounds", store, kind, over.Name, what, r, cfg.rounds)
						continue
					}
					for _, x := range r.Rounds {
						if !finite(x) || x <= 0 {
							t.Errorf("%s %s ÷ %s, %s: a round's ratio is %v", store, kind, over.Name, what, x)
						}
					}
				}
			}
		}
	}
	// What benchchart reads.
	var buf bytes.Buffer
	if err := rep.Write(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := benchreport.Read(&buf)
	if err != nil {
		t.Fatalf("reading the report back: %v", err)
	}
	if len(back.Comparisons) != len(rep.Comparisons) || len(back.Phases) != len(rep.Phases) {
		t.Errorf("read back: %d comparisons, %d phases; want %d, %d", len(back.Comparisons), len(back.Phases), len(rep.Comparisons), len(rep.Phases))
	}
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// A revision without the server program gets this tree's, with the stores'
// imports changed to where the revision keeps them.
func TestTransplant(t *testing.T) {
	src := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/old\n\ngo 1.26\n")
	for _, dir := range []string{"store/memstore", "store/pgstore", "store/redisstore"} {
		write(dir+"/doc.go", "package x\n")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		servicetest.Unavailable(t, "git", err)
	}
	b := &builder{root: strings.TrimSpace(string(top)), module: "github.com/idemkit/idempotency"}
	where, err := b.transplant(src)
	if err != nil {
		t.Fatal(err)
	}
	if where != "store/memstore, store/pgstore, store/redisstore" {
		t.Errorf("transplant() = %q, want the stores' places", where)
	}
	code, err := os.ReadFile(filepath.Join(src, abserverDir, idemFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range []string{`"example.com/old/server"`, `"example.com/old/store/memstore"`, `"example.com/old/store/pgstore"`, `"example.com/old/store/redisstore"`} {
		if !bytes.Contains(code, []byte(imp)) {
			t.Errorf("%s does not import %s:\n%s", idemFile, imp, code)
		}
	}
	if bytes.Contains(code, []byte("github.com/idemkit/idempotency")) {
		t.Errorf("%s still imports this module's path:\n%s", idemFile, code)
	}
	files, err := b.serverFiles()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(files, peerFile) || !slices.Contains(files, "main.go") {
		t.Errorf("server files = %v, want main.go and not %s", files, peerFile)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(src, abserverDir, f)); err != nil {
			t.Errorf("%s not put in the revision: %v", f, err)
		}
	}
}

// The A/B mode runs 4 rounds and 10,000 records unless told otherwise, and
// refuses what it does not do.
func TestABDefaults(t *testing.T) {
	cfg := config{rounds: 3, records: []int{0}}
	if err := abDefaults(&cfg, map[string]bool{"ab": true}); err != nil || cfg.rounds != 4 || !slices.Equal(cfg.records, []int{10_000}) {
		t.Errorf("abDefaults = %v: %d rounds, records %v; want 4, [10000]", err, cfg.rounds, cfg.records)
	}
	cfg = config{rounds: 6, records: []int{5}}
	if err := abDefaults(&cfg, map[string]bool{"rounds": true, "records": true}); err != nil || cfg.rounds != 6 || !slices.Equal(cfg.records, []int{5}) {
		t.Errorf("abDefaults with -rounds and -records = %v: %d rounds, records %v; want them kept", err, cfg.rounds, cfg.records)
	}
	for _, f := range []string{"sweep", "cpuprofile", "redis-url"} {
		if err := abDefaults(&config{}, map[string]bool{f: true}); err == nil {
			t.Errorf("abDefaults with -%s: no error", f)
		}
	}
}

// startServer returns once the program says where it serves, every time
// (-ab.starts times), and says why when it does not.
func TestStartServer(t *testing.T) {
	start := func(line string) (*serverProc, error) {
		t.Setenv(envServer, line)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		type started struct {
			p   *serverProc
			err error
		}
		done := make(chan started, 1)
		go func() {
			p, err := startServer(ctx, &http.Client{}, os.Args[0], nil, nil)
			done <- started{p, err}
		}()
		select {
		case s := <-done:
			return s.p, s.err
		case <-time.After(time.Minute):
			t.Fatalf("startServer with %q has not returned after a minute", line)
			return nil, nil
		}
	}
	for range *abStarts {
		p, err := start(fmt.Sprintf(`{"protocol":%d,"url":"http://127.0.0.1:9"}`, abProtocol))
		if err != nil {
			t.Fatal(err)
		}
		if p.url != "http://127.0.0.1:9" {
			t.Errorf("url = %q, want http://127.0.0.1:9", p.url)
		}
		p.stop()
	}
	if _, err := start(""); err == nil || !strings.Contains(err.Error(), "cannot serve") {
		t.Errorf("a program that exits at once: %v, want an error with what it printed", err)
	}
	if _, err := start(`{"protocol":99,"url":"http://127.0.0.1:9"}`); err == nil || !strings.Contains(err.Error(), "protocol 99") {
		t.Errorf("a program of another protocol: %v, want an error naming it", err)
	}
}

// A round's order is random, with the variants of each store and kind one
// after the other.
func TestShuffle(t *testing.T) {
	var specs []abSpec
	vs := []*abVariant{{tag: "a"}, {tag: "b"}, {tag: "c"}}
	for _, store := range []string{benchreport.Memory, benchreport.Redis} {
		for _, v := range vs {
			tg := &abTarget{v: v, store: store}
			specs = append(specs, abSpec{tg, benchreport.KindFirst}, abSpec{tg, benchreport.KindReplay})
		}
	}
	orders := map[string]bool{}
	for range 200 {
		got := shuffle(specs)
		if len(got) != len(specs) {
			t.Fatalf("shuffle: %d phases, want %d", len(got), len(specs))
		}
		var names []string
		seen := map[abSpec]bool{}
		for i, sp := range got {
			if seen[sp] {
				t.Fatalf("shuffle: %v twice", sp)
			}
			seen[sp] = true
			if i%len(vs) != 0 && (sp.t.store != got[i-1].t.store || sp.kind != got[i-1].kind) {
				t.Fatalf("shuffle: phase %d (%s %s) is not next to the other variants of %s %s", i, sp.t.store, sp.kind, got[i-1].t.store, got[i-1].kind)
			}
			names = append(names, sp.t.store+sp.kind+sp.t.v.tag)
		}
		orders[strings.Join(names, ",")] = true
	}
	if len(orders) < 100 {
		t.Errorf("shuffle gave %d orders in 200 rounds, want most of them different", len(orders))
	}
}

// A run that cannot start says why, for a revision that is not one and for
// a revision whose server speaks another protocol.
func TestABRefuses(t *testing.T) {
	for _, tc := range []struct{ rev, want string }{
		{"no-such-revision", "not a revision"},
	} {
		cfg := config{stores: []string{benchreport.Memory}, concurrency: []int{1}, records: []int{0}, duration: 50 * time.Millisecond, rounds: 1, pool: 1, ab: tc.rev}
		rep, err := runAB(context.Background(), cfg, io.Discard, testLoadgen)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-ab %s: %v, want an error saying %q", tc.rev, err, tc.want)
		}
		if rep != nil && len(rep.Phases) > 0 {
			t.Errorf("-ab %s: %d phases measured", tc.rev, len(rep.Phases))
		}
	}
}

// A ratio over a measure of nothing is left out: the JSON has no NaN.
func TestRatioRounds(t *testing.T) {
	var rr ratioRounds
	two, zero := 2.0, 0.0
	rr.add(benchreport.Measure{PerSecond: 10, ServerCPU: 4, StoreCPU: &two}, benchreport.Measure{PerSecond: 5, ServerCPU: 0, StoreCPU: &zero})
	rr.add(benchreport.Measure{PerSecond: 10, ServerCPU: 4}, benchreport.Measure{PerSecond: 20, ServerCPU: 8, StoreCPU: &two})
	if !slices.Equal(rr.perSecond, []float64{2, 0.5}) || !slices.Equal(rr.serverCPU, []float64{0.5}) || len(rr.storeCPU) != 0 {
		t.Errorf("ratios = %v, %v, %v; want [2 0.5], [0.5], []", rr.perSecond, rr.serverCPU, rr.storeCPU)
	}
	if !math.IsNaN(last(nil)) {
		t.Errorf("last(nil) = %v, want NaN", last(nil))
	}
}
