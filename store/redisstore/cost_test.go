package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// The server time of the store's operations, from the Redis server's own
// accounting (INFO commandstats), against the plain commands that would do
// the same work with no protocol: SET NX PX then SET XX PX for a first
// execution, GET for a replay. It is measured on a redis-server of its own,
// so that nobody else's commands are counted, phase by phase, the phases
// taking turns so that the machine's noise falls on all of them alike.

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec int64 }

// commandStats reads INFO commandstats. Subcommands are keyed as Redis names
// them ("function|load").
func commandStats(ctx context.Context, c *redis.Client) (map[string]cmdStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := map[string]cmdStat{}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			return nil, fmt.Errorf("commandstats line %q", line)
		}
		var s cmdStat
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				s.calls, err = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.usec, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil {
				return nil, fmt.Errorf("commandstats line %q: %w", line, err)
			}
		}
		stats[name] = s
	}
	return stats, nil
}

// phaseCost is the server time, and the number, of the commands one phase
// sent. A script's or function's time includes the commands it calls, which
// Redis also counts under their own names: only the commands the client sent
// are added up.
type phaseCost struct{ calls, usec int64 }

func (p phaseCost) perOp(ops int) float64 { return float64(p.usec) / float64(ops) }

// floorLibrary holds the least that functions can do for a first execution
// and a replay, with none of the store's checks: a claim that is one SET NX
// PX GET, a completion that is one SET PX of the whole record, a replay that
// is one GET. It measures what calling a function, and passing the record
// through Lua, costs by itself.
const floorLibrary = `#!lua name=cost_floor
redis.register_function('cost_floor_claim', function(keys, args)
  return redis.call('SET', keys[1], args[1], 'NX', 'PX', args[2], 'GET') or 1
end)
redis.register_function('cost_floor_complete', function(keys, args)
  redis.call('SET', keys[1], args[1], 'PX', args[2])
  return 1
end)
redis.register_function('cost_floor_replay', function(keys, args)
  return redis.call('GET', keys[1])
end)
`

// meter runs phases on a client whose commands sent holds, and reads the
// server's accounting through admin, whose own commands are not counted.
type meter struct {
	admin *redis.Client
	sent  *commandCounter
}

// run runs fn(i) for i in [lo, hi) and adds the server time of the commands
// it sent to cost.
func (m *meter) run(ctx context.Context, cost *phaseCost, lo, hi int, fn func(i int) error) error {
	before, err := commandStats(ctx, m.admin)
	if err != nil {
		return err
	}
	m.sent.take()
	for i := lo; i < hi; i++ {
		if err := fn(i); err != nil {
			return err
		}
	}
	names := map[string]bool{}
	for _, n := range m.sent.take() {
		names[n] = true
	}
	after, err := commandStats(ctx, m.admin)
	if err != nil {
		return err
	}
	for name, s := range after {
		top, _, _ := strings.Cut(name, "|")
		if names[top] {
			cost.calls += s.calls - before[name].calls
			cost.usec += s.usec - before[name].usec
		}
	}
	return nil
}

// roundCost is what one round's first executions and replays cost the
// server, through the store and through the plain commands.
type roundCost struct {
	ops                                int
	storeFirst, plainFirst, floorFirst phaseCost
	// storeComplete is the completions' part of storeFirst.
	storeComplete                         phaseCost
	storeReplay, plainReplay, floorReplay phaseCost
}

// serverCost is what every round cost.
type serverCost struct {
	rounds        []roundCost
	recordInBytes int
}

// total adds up the rounds.
func (c serverCost) total() roundCost {
	var t roundCost
	for _, r := range c.rounds {
		t.ops += r.ops
		for _, p := range [][2]*phaseCost{
			{&t.storeFirst, &r.storeFirst}, {&t.plainFirst, &r.plainFirst}, {&t.floorFirst, &r.floorFirst},
			{&t.storeComplete, &r.storeComplete},
			{&t.storeReplay, &r.storeReplay}, {&t.plainReplay, &r.plainReplay}, {&t.floorReplay, &r.floorReplay},
		} {
			p[0].calls += p[1].calls
			p[0].usec += p[1].usec
		}
	}
	return t
}

// median returns the median over the rounds of f, so that a round that the
// machine's other work slowed down moves it little.
func (c serverCost) median(f func(roundCost) float64) float64 {
	v := make([]float64, len(c.rounds))
	for i, r := range c.rounds {
		v[i] = f(r)
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

func ratio(a, b phaseCost) float64 { return float64(a.usec) / float64(max(1, b.usec)) }

// measureServerCost starts a redis-server of its own and measures n first
// executions (a Claim that acquires and a Complete of a 1 KiB response) and
// n replays (a Claim that finds it), and as many SET NX PX and SET XX PX
// pairs and GETs of values of the same sizes, in rounds taking turns.
func measureServerCost(t testing.TB, n, rounds int) serverCost {
	t.Helper()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { admin.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	const lease, ttl = time.Minute, time.Hour
	fp := string(make([]byte, 32)) // a SHA-256, as server.Fingerprint makes
	resp := benchResponse()

	// Warm up: whatever the store loads into the server, it loads now. The
	// record written gives the plain commands values of the same sizes.
	warm := engine.ID{Scope: "warm", Key: "up"}
	cl, err := s.Claim(ctx, warm, fp, lease, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, warm, cl.Token, lease); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, warm, cl.Token); err != nil {
		t.Fatal(err)
	}
	if cl, err = s.Claim(ctx, warm, fp, lease, ttl); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, warm, cl.Token, resp, ttl); err != nil {
		t.Fatal(err)
	}
	record, err := admin.Get(ctx, s.RecordKey(warm)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.FunctionLoad(ctx, floorLibrary).Err(); err != nil {
		t.Fatal(err)
	}
	inFlight := record[:30+len(fp)] // an in-flight record's size

	counter := &commandCounter{}
	c.AddHook(counter)
	m := &meter{admin: admin, sent: counter}
	cost := serverCost{recordInBytes: len(record)}
	if b, ok := t.(*testing.B); ok {
		b.ResetTimer()
	}
	id := func(i int) engine.ID { return engine.ID{Scope: "tenant-0123456789", Key: "order-" + strconv.Itoa(i)} }
	plainKey := func(i int) string { return "plain:" + s.RecordKey(id(i)) }
	floorKey := func(i int) string { return "floor:" + s.RecordKey(id(i)) }
	for r := range rounds {
		lo, hi := r*n/rounds, (r+1)*n/rounds
		rc := roundCost{ops: hi - lo}
		tokens := make([]engine.Token, hi-lo)
		for _, phase := range []struct {
			cost *phaseCost
			op   func(i int) error
		}{
			// The claims, then their completions: a claim is a SET, which
			// Redis also counts when a function calls it (the completion),
			// so the two are measured apart.
			{&rc.storeFirst, func(i int) error {
				cl, err := s.Claim(ctx, id(i), fp, lease, ttl)
				if err != nil || cl.Status != engine.Acquired {
					return fmt.Errorf("Claim = %v, %v; want acquired", cl.Status, err)
				}
				tokens[i-lo] = cl.Token
				return nil
			}},
			{&rc.storeComplete, func(i int) error { return s.Complete(ctx, id(i), tokens[i-lo], resp, ttl) }},
			{&rc.plainFirst, func(i int) error {
				if ok, err := c.SetNX(ctx, plainKey(i), fp, lease).Result(); err != nil || !ok {
					return fmt.Errorf("SET NX = %v, %v; want set", ok, err)
				}
				if ok, err := c.SetXX(ctx, plainKey(i), record, ttl).Result(); err != nil || !ok {
					return fmt.Errorf("SET XX = %v, %v; want set", ok, err)
				}
				return nil
			}},
			{&rc.floorFirst, func(i int) error {
				if err := c.FCall(ctx, "cost_floor_claim", []string{floorKey(i)}, inFlight, lease.Milliseconds()).Err(); err != nil {
					return err
				}
				return c.FCall(ctx, "cost_floor_complete", []string{floorKey(i)}, record, ttl.Milliseconds()).Err()
			}},
			{&rc.storeReplay, func(i int) error {
				cl, err := s.Claim(ctx, id(i), fp, lease, ttl)
				if err != nil || cl.Status != engine.Completed || len(cl.Response.Body) != len(resp.Body) {
					return fmt.Errorf("Claim = %v, %v; want the completed response", cl.Status, err)
				}
				return nil
			}},
			{&rc.plainReplay, func(i int) error {
				if v, err := c.Get(ctx, plainKey(i)).Result(); err != nil || len(v) != len(record) {
					return fmt.Errorf("GET = %d bytes, %v; want %d bytes", len(v), err, len(record))
				}
				return nil
			}},
			{&rc.floorReplay, func(i int) error {
				if v, err := c.FCall(ctx, "cost_floor_replay", []string{floorKey(i)}).Text(); err != nil || len(v) != len(record) {
					return fmt.Errorf("cost_floor_replay = %d bytes, %v; want %d bytes", len(v), err, len(record))
				}
				return nil
			}},
		} {
			if err := m.run(ctx, phase.cost, lo, hi, phase.op); err != nil {
				t.Fatalf("round %d: %v", r, err)
			}
		}
		rc.storeFirst.calls += rc.storeComplete.calls
		rc.storeFirst.usec += rc.storeComplete.usec
		cost.rounds = append(cost.rounds, rc)
	}
	return cost
}

// The measurement counts one command per operation, and time for each.
func TestServerCostMeasurement(t *testing.T) {
	t.Parallel()
	const n = 40
	cost := measureServerCost(t, n, 2).total()
	for _, tc := range []struct {
		name  string
		got   phaseCost
		calls int64
	}{
		{"store, first executions", cost.storeFirst, 2 * n},
		{"SET NX PX + SET XX PX", cost.plainFirst, 2 * n},
		{"least functions, first executions", cost.floorFirst, 2 * n},
		{"store, replays", cost.storeReplay, n},
		{"GET", cost.plainReplay, n},
		{"least function, replays", cost.floorReplay, n},
	} {
		if tc.got.calls != tc.calls || tc.got.usec <= 0 {
			t.Errorf("%s: %d commands in %d µs, want %d commands in some time", tc.name, tc.got.calls, tc.got.usec, tc.calls)
		}
	}
	t.Logf("server µs per first execution: store %.2f, plain %.2f; per replay: store %.2f, GET %.2f",
		cost.storeFirst.perOp(n), cost.plainFirst.perOp(n), cost.storeReplay.perOp(n), cost.plainReplay.perOp(n))
}

// BenchmarkServerCost reports the Redis server's time per first execution
// and per replay, through the store and through the plain commands, and
// their ratios, all from one run:
//
//	go test -run '^$' -bench ServerCost -benchtime 20000x ./store/redisstore/
//
// Each of the b.N iterations is a first execution, a replay, a SET NX PX and
// SET XX PX pair, a GET, and a first execution and a replay through the
// least functions (floorLibrary), in 20 rounds of b.N/20 (fewer when b.N is
// small). The times, and the ratios first-x and replay-x, are totals over
// the rounds; first-x-med and replay-x-med are the medians of the rounds'
// ratios, which a round slowed down by the machine's other work moves less;
// floor-first-x and floor-replay-x are the least functions' ratios to the
// plain commands, the least that any store made of functions can reach.
// ns/op is the client's time for all of them.
func BenchmarkServerCost(b *testing.B) {
	b.ReportAllocs()
	cost := measureServerCost(b, b.N, min(b.N, 20))
	t := cost.total()
	b.ReportMetric(t.storeFirst.perOp(b.N), "store-µs/first")
	b.ReportMetric(t.storeComplete.perOp(b.N), "complete-µs/first")
	b.ReportMetric(t.plainFirst.perOp(b.N), "plain-µs/first")
	b.ReportMetric(ratio(t.storeFirst, t.plainFirst), "first-x")
	b.ReportMetric(cost.median(func(r roundCost) float64 { return ratio(r.storeFirst, r.plainFirst) }), "first-x-med")
	b.ReportMetric(t.storeReplay.perOp(b.N), "store-µs/replay")
	b.ReportMetric(t.plainReplay.perOp(b.N), "get-µs/replay")
	b.ReportMetric(ratio(t.storeReplay, t.plainReplay), "replay-x")
	b.ReportMetric(cost.median(func(r roundCost) float64 { return ratio(r.storeReplay, r.plainReplay) }), "replay-x-med")
	b.ReportMetric(ratio(t.floorFirst, t.plainFirst), "floor-first-x")
	b.ReportMetric(ratio(t.floorReplay, t.plainReplay), "floor-replay-x")
	b.ReportMetric(float64(cost.recordInBytes), "record-bytes")
}
