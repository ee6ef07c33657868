// Package benchreport is the format of the load benchmark's results: what
// internal/cmd/loadbench writes with -json and internal/cmd/benchchart draws.
// Times are in microseconds, sizes in bytes; a measure that a run could not
// take (a store server on another machine, a store without round trips) is
// nil, and left out of the JSON.
package benchreport

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// Store names used in Phase.Store. Bare is the handler without the
// middleware.
const (
	Bare     = "bare"
	Memory   = "memory"
	Postgres = "postgres"
	Redis    = "redis"
)

// Kinds of phase, in Phase.Kind.
const (
	// KindBare is the handler alone.
	KindBare = "bare"
	// KindFirst is the middleware with a new key on every request.
	KindFirst = "first"
	// KindReplay is the middleware with one completed key on every request.
	KindReplay = "replay"
)

// Report is one run of the load benchmark.
type Report struct {
	// Command is the command line that produced the report.
	Command  string   `json:"command"`
	Machine  Machine  `json:"machine"`
	Settings Settings `json:"settings"`
	// Phases holds one entry for each combination of records held,
	// concurrency, store and kind, in the order they first ran.
	Phases []Phase `json:"phases"`
	// Sizes holds what a record costs each store, for each number of
	// records the run prefilled.
	Sizes []Size `json:"sizes,omitempty"`
	// Sweeps holds the runs of first executions around a sweep (or an
	// expiry) of expired records.
	Sweeps []Sweep `json:"sweeps,omitempty"`
	// Variants are the servers that a run of the A/B mode compared (this
	// tree, a revision, a peer, the minimal statements), in the order
	// given; empty in a run of one tree.
	Variants []Variant `json:"variants,omitempty"`
	// Comparisons hold, in the A/B mode, the ratios of this tree's
	// measures over each other variant's, and of the minimal statements'
	// over the peer's when the run has both, taken within each round.
	Comparisons []Comparison `json:"comparisons,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPU        string `json:"cpu"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	Kernel     string `json:"kernel,omitempty"`
	Go         string `json:"go"`
	MemoryMiB  int    `json:"memory_mib,omitempty"`
	Postgres   string `json:"postgres,omitempty"`
	Redis      string `json:"redis,omitempty"`
	// LoadBefore and LoadAfter are the 1, 5 and 15 minute load averages
	// at the start and the end of the run.
	LoadBefore [3]float64 `json:"load_before"`
	LoadAfter  [3]float64 `json:"load_after"`
	// Commit is the repository's commit, when known.
	Commit string `json:"commit,omitempty"`
}

// Settings are the run's parameters.
type Settings struct {
	PhaseSeconds float64 `json:"phase_seconds"`
	Rounds       int     `json:"rounds"`
	BodyBytes    int     `json:"body_bytes"`
	// Pool is the most connections a network store's client opens.
	Pool        int      `json:"pool"`
	Concurrency []int    `json:"concurrency"`
	Records     []int    `json:"records"`
	Stores      []string `json:"stores"`
	// RedisServer says which Redis the run used: "own" for one it started,
	// or "external".
	RedisServer string `json:"redis_server,omitempty"`
	// PostgresCPU says whose CPU time StoreCPU counts for PostgreSQL.
	PostgresCPU string `json:"postgres_cpu,omitempty"`
}

// Phase is one combination of records held, concurrency, store and kind,
// measured in every round.
type Phase struct {
	// Records is how many records the store held when each round began.
	Records     int `json:"records"`
	Concurrency int `json:"concurrency"`
	// Store is the store's name; in the A/B mode, the store's and the
	// variant's, "redis main", so that every variant is a series of its
	// own wherever phases are told apart by store and kind.
	Store string `json:"store"`
	// Variant is the name of the A/B mode's variant, empty otherwise.
	Variant string `json:"variant,omitempty"`
	Kind    string `json:"kind"`
	// Rounds holds each round's measure, in the order the rounds ran.
	Rounds []Measure `json:"rounds"`
	// Median holds, for each field, the median over the rounds.
	Median Measure `json:"median"`
}

// Measure is what one phase measured in one round. Per-request figures are
// divided by the requests answered.
type Measure struct {
	Requests int64 `json:"requests"`
	// OK counts the answers with the handler's status, 201.
	OK int64 `json:"ok"`
	// Other counts every other answer and transport error.
	Other   int64   `json:"other,omitempty"`
	Seconds float64 `json:"seconds"`
	// PerSecond is OK answers per second.
	PerSecond float64 `json:"per_second"`
	// P50 and P99 are the latencies seen by the load generator, µs.
	P50 float64 `json:"p50_us"`
	P99 float64 `json:"p99_us"`
	// ServerCPU is the CPU time of the process serving HTTP (middleware,
	// store client, memstore), µs per request. In the A/B mode each
	// variant's server is a process of its own; otherwise it is the
	// process that runs the benchmark.
	ServerCPU float64 `json:"server_cpu_us"`
	// ServerCPUOverBare is ServerCPU less the bare handler's in the same
	// round and at the same concurrency.
	ServerCPUOverBare *float64 `json:"server_cpu_over_bare_us,omitempty"`
	// LoadCPU is the load generator's CPU time, µs per request.
	LoadCPU float64 `json:"load_cpu_us"`
	// PerSecondVsBare is PerSecond over the bare handler's in the same
	// round and at the same concurrency.
	PerSecondVsBare *float64 `json:"per_second_vs_bare,omitempty"`
	// StoreCPU is the store server's CPU time, µs per request.
	StoreCPU *float64 `json:"store_cpu_us,omitempty"`
	// RoundTrips counts the writes the store client made on its
	// connections, each answered before the next: round trips per request.
	RoundTrips *float64 `json:"round_trips,omitempty"`
	// StoreCalls is the store server's own count of the calls it ran, per
	// request (Redis: FCALL from INFO commandstats, and in the A/B mode
	// every command but INFO, those that functions and scripts call
	// included; PostgreSQL: statements on the table from
	// pg_stat_statements, when loaded).
	StoreCalls *float64 `json:"store_calls,omitempty"`
	// WireBytes is the bytes the store client sent and received, per
	// request.
	WireBytes *float64 `json:"wire_bytes,omitempty"`
}

// Variant is one server of an A/B run.
type Variant struct {
	// Name names the variant in Phase.Variant and Comparison.Over: "this"
	// for the working tree, the revision as given, "peer", "minimal".
	Name string `json:"name"`
	// Source is VariantTree, VariantRevision, VariantPeer or
	// VariantMinimal.
	Source string `json:"source"`
	// Commit is a revision's commit.
	Commit string `json:"commit,omitempty"`
	// Built says what the server program was built from.
	Built string `json:"built,omitempty"`
}

// Sources of a Variant.
const (
	// VariantTree is the working tree the run was started in.
	VariantTree = "tree"
	// VariantRevision is a git revision of the repository.
	VariantRevision = "revision"
	// VariantPeer is another library's middleware, on stores of its own.
	VariantPeer = "peer"
	// VariantMinimal is the fewest store statements that a first
	// execution and a replay need, behind the same HTTP server.
	VariantMinimal = "minimal"
)

// Comparison is, for one store and kind of phase, this tree's measures
// over another variant's, in each round.
type Comparison struct {
	Records     int `json:"records"`
	Concurrency int `json:"concurrency"`
	// Store is the store's name alone: memory, postgres, redis.
	Store string `json:"store"`
	Kind  string `json:"kind"`
	// Over names the variant divided by.
	Over string `json:"over"`
	// Variant names the variant divided, when it is not this tree: the
	// minimal statements over the peer, the floor of this tree's ratios
	// over the peer.
	Variant string `json:"variant,omitempty"`
	// PerSecond is requests per second, Variant's (this tree's) over Over's.
	PerSecond *Ratio `json:"per_second,omitempty"`
	// ServerCPU is the serving process's CPU time per request.
	ServerCPU *Ratio `json:"server_cpu,omitempty"`
	// StoreCPU is the store server's CPU time per request.
	StoreCPU *Ratio `json:"store_cpu,omitempty"`
}

// Ratio is a ratio taken in each round, and its median and range.
type Ratio struct {
	Rounds []float64 `json:"rounds"`
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
}

// NewRatio returns the ratio of the rounds given, nil if there are none.
func NewRatio(rounds []float64) *Ratio {
	if len(rounds) == 0 {
		return nil
	}
	return &Ratio{Rounds: rounds, Median: Median(rounds), Min: slices.Min(rounds), Max: slices.Max(rounds)}
}

// Size is what a record costs a store.
type Size struct {
	Store   string `json:"store"`
	Records int    `json:"records"`
	// Items are named costs in bytes per record, in a fixed order.
	Items []SizeItem `json:"items"`
}

// SizeItem is one named cost in bytes per record.
type SizeItem struct {
	What           string  `json:"what"`
	BytesPerRecord float64 `json:"bytes_per_record"`
}

// Sweep is a run of first executions before, during and after the removal
// of expired records.
type Sweep struct {
	Store string `json:"store"`
	// Expired is how many expired records the store held.
	Expired     int `json:"expired"`
	Concurrency int `json:"concurrency"`
	// How says what removed the records: "Sweep(batch N)", the store's
	// background sweep, or the server's own expiry.
	How string `json:"how"`
	// Removed is how many expired records went, in Seconds.
	Removed       int     `json:"removed"`
	Seconds       float64 `json:"seconds"`
	RowsPerSecond float64 `json:"rows_per_second"`
	// Windows are before, during and after.
	Windows []Window `json:"windows"`
}

// Window is a stretch of a sweep run.
type Window struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// Claims counts the store's Claim calls in the window; the latencies
	// are theirs, µs.
	Claims   int64   `json:"claims"`
	ClaimP50 float64 `json:"claim_p50_us"`
	ClaimP99 float64 `json:"claim_p99_us"`
	ClaimMax float64 `json:"claim_max_us"`
	// PerSecond, P50 and P99 are the HTTP requests', as in Measure.
	PerSecond float64 `json:"per_second"`
	P50       float64 `json:"p50_us"`
	P99       float64 `json:"p99_us"`
}

// Read decodes a report, refusing unknown fields so that a report from
// another version of the format fails loudly.
func Read(r io.Reader) (*Report, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var rep Report
	if err := dec.Decode(&rep); err != nil {
		return nil, fmt.Errorf("benchreport: read: %w", err)
	}
	return &rep, nil
}

// Write encodes a report, indented.
func (r *Report) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("benchreport: write: %w", err)
	}
	return nil
}

// Find returns the phase with the given records, concurrency, store and
// kind, or nil.
func (r *Report) Find(records, concurrency int, store, kind string) *Phase {
	for i := range r.Phases {
		p := &r.Phases[i]
		if p.Records == records && p.Concurrency == concurrency && p.Store == store && p.Kind == kind {
			return p
		}
	}
	return nil
}

// Summarize sets Median from Rounds.
func (p *Phase) Summarize() {
	p.Median = MedianOf(p.Rounds)
}

// MedianOf returns, field by field, the median of ms. A pointer field is
// the median of the rounds that have it, nil if none has.
func MedianOf(ms []Measure) Measure {
	ints := func(f func(Measure) int64) int64 {
		v := make([]float64, len(ms))
		for i, m := range ms {
			v[i] = float64(f(m))
		}
		return int64(Median(v))
	}
	floats := func(f func(Measure) float64) float64 {
		v := make([]float64, len(ms))
		for i, m := range ms {
			v[i] = f(m)
		}
		return Median(v)
	}
	opt := func(f func(Measure) *float64) *float64 {
		var v []float64
		for _, m := range ms {
			if p := f(m); p != nil {
				v = append(v, *p)
			}
		}
		if len(v) == 0 {
			return nil
		}
		x := Median(v)
		return &x
	}
	return Measure{
		Requests:          ints(func(m Measure) int64 { return m.Requests }),
		OK:                ints(func(m Measure) int64 { return m.OK }),
		Other:             ints(func(m Measure) int64 { return m.Other }),
		Seconds:           floats(func(m Measure) float64 { return m.Seconds }),
		PerSecond:         floats(func(m Measure) float64 { return m.PerSecond }),
		P50:               floats(func(m Measure) float64 { return m.P50 }),
		P99:               floats(func(m Measure) float64 { return m.P99 }),
		ServerCPU:         floats(func(m Measure) float64 { return m.ServerCPU }),
		ServerCPUOverBare: opt(func(m Measure) *float64 { return m.ServerCPUOverBare }),
		LoadCPU:           floats(func(m Measure) float64 { return m.LoadCPU }),
		PerSecondVsBare:   opt(func(m Measure) *float64 { return m.PerSecondVsBare }),
		StoreCPU:          opt(func(m Measure) *float64 { return m.StoreCPU }),
		RoundTrips:        opt(func(m Measure) *float64 { return m.RoundTrips }),
		StoreCalls:        opt(func(m Measure) *float64 { return m.StoreCalls }),
		WireBytes:         opt(func(m Measure) *float64 { return m.WireBytes }),
	}
}

// Median returns the median of v (the mean of the middle two for an even
// count), or 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}
