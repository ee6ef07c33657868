package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
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

// noStore is memory's: the records live in the server, which replaces its
// store before each phase.
type noStore struct{}

func (noStore) fill(context.Context, int) error           { return nil }
func (noStore) clean(context.Context) error               { return nil }
func (noStore) cpu(context.Context) (time.Duration, bool) { return 0, false }
func (noStore) calls(context.Context) (int64, bool)       { return 0, false }
func (noStore) close()                                    {}
