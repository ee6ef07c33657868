package idemgrpc_test

import (
	"bytes"
	"context"
	"flag"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

var (
	lostCalls = flag.Int("idemgrpc.calls", 300, "calls in each run of TestLostAnswers")
	lostSeed  = flag.Uint64("idemgrpc.seed", 20, "seed of TestLostAnswers' plan of lost answers")
)

// retryPolicy is a service config with which gRPC itself retries
// Unavailable, as a client without the interceptor's retries would.
const retryPolicy = `{"methodConfig": [{
	"name": [{"service": "grpc.testing.TestService"}],
	"retryPolicy": {
		"maxAttempts": 5,
		"initialBackoff": "0.001s",
		"maxBackoff": "0.01s",
		"backoffMultiplier": 2,
		"retryableStatusCodes": ["UNAVAILABLE"]
	}
}]}`

// lossPlan returns, for each of n calls, how many of its answers the proxy
// loses: 0 for most, 1 for about 15%, 2 for about 5%, the same for a seed
// on every run.
func lossPlan(n int, seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, seed))
	plan := make([]int, n)
	for i := range plan {
		switch r := rng.Float64(); {
		case r < 0.05:
			plan[i] = 2
		case r < 0.20:
			plan[i] = 1
		}
	}
	return plan
}

// runLossy makes the planned calls one after another, each with the
// answers the plan says lost, and checks that each was answered with its
// own id. It returns the interceptor's attempts (one per call without it)
// and the number of calls answered with a replay.
func runLossy(t *testing.T, f *fixture, plan []int) (attempts, replayed int) {
	t.Helper()
	c := f.client()
	for i, lose := range plan {
		id := strconv.Itoa(i)
		f.proxy.Arm(lose)
		rep := idemgrpc.Report{Attempts: 1}
		var header metadata.MD
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := c.UnaryCall(ctx, request(id), idemgrpc.WithReport(&rep), grpc.Header(&header))
		cancel()
		f.proxy.Arm(0)
		attempts += rep.Attempts
		if idemgrpc.Replayed(header) {
			replayed++
		}
		if err != nil {
			t.Fatalf("call %d (answers lost: %d): %v", i, lose, err)
		}
		if !bytes.Equal(resp.GetPayload().GetBody(), []byte(id)) {
			t.Fatalf("call %d answered %q", i, resp.GetPayload().GetBody())
		}
	}
	return attempts, replayed
}

// TestLostAnswers makes -idemgrpc.calls calls over a real loopback gRPC
// connection through a proxy that loses the answers of some of them after
// the server ran them (a seeded plan), and counts the handler's
// executions: with the interceptors on both sides there is one per call,
// on each store; without them, every lost answer is one more.
func TestLostAnswers(t *testing.T) {
	plan := lossPlan(*lostCalls, *lostSeed)
	planned, hit := 0, 0 // answers lost, calls that lose one or more
	for _, n := range plan {
		planned += n
		if n > 0 {
			hit++
		}
	}
	retrying := []idemgrpc.Option{idemgrpc.WithMaxAttempts(10), idemgrpc.WithBackoff(time.Millisecond, 20*time.Millisecond)}
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{store: kind.New(t), client: clientInterceptor(t, retrying...)})
			attempts, replayed := runLossy(t, f, plan)
			total, dup := f.svc.eff.snapshot()
			t.Logf("%s: %d calls, %d answers lost, %d executions, %d calls run more than once; %d attempts, %d calls answered with a replay",
				kind.Name, len(plan), f.proxy.Lost(), total, dup, attempts, replayed)
			if f.proxy.Lost() != planned {
				t.Errorf("answers lost = %d, want %d", f.proxy.Lost(), planned)
			}
			if total != len(plan) || dup != 0 {
				t.Errorf("executions = %d (%d calls more than once), want %d", total, dup, len(plan))
			}
			// Each lost answer is one more attempt, and the last attempt of
			// a call that lost one gets it replayed.
			if attempts != len(plan)+planned || replayed != hit {
				t.Errorf("attempts = %d, replays = %d; want %d, %d", attempts, replayed, len(plan)+planned, hit)
			}
		})
	}
	// gRPC's own retries, under a retryPolicy, with the interceptor only
	// giving the key: every retry carries it.
	t.Run("memory/grpc-retry-policy", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{
			store:    teststores.Memory(t),
			client:   clientInterceptor(t, idemgrpc.WithMaxAttempts(1)),
			dialOpts: []grpc.DialOption{grpc.WithDefaultServiceConfig(retryPolicy)},
		})
		_, replayed := runLossy(t, f, plan)
		total, dup := f.svc.eff.snapshot()
		t.Logf("grpc retry policy: %d calls, %d answers lost, %d executions, %d calls run more than once; %d calls answered with a replay",
			len(plan), f.proxy.Lost(), total, dup, replayed)
		if total != len(plan) || dup != 0 || replayed != hit {
			t.Errorf("executions = %d (%d calls more than once), replays = %d; want %d, %d", total, dup, replayed, len(plan), hit)
		}
	})
	// The same calls without the interceptors, retried by gRPC: every lost
	// answer is a second execution.
	t.Run("without-interceptors", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{dialOpts: []grpc.DialOption{grpc.WithDefaultServiceConfig(retryPolicy)}})
		runLossy(t, f, plan)
		total, dup := f.svc.eff.snapshot()
		t.Logf("without interceptors: %d calls, %d answers lost, %d executions, %d calls run more than once", len(plan), f.proxy.Lost(), total, dup)
		if want := len(plan) + f.proxy.Lost(); total != want || dup == 0 {
			t.Errorf("executions = %d (%d calls more than once), want %d, with duplicates", total, dup, want)
		}
	})
}
