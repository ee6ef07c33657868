package redisstore_test

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// benchClients is how many goroutines the benchmarks run, as many as the
// concurrent clients of the HTTP benchmark whose ceiling they measure.
const benchClients = 32

// roundTrips is a go-redis hook that counts commands, cheaply enough to
// leave on while benchmarking.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// benchStore returns a Store on the shared Redis whose client has a
// connection for every goroutine, and a hook counting its round trips.
func benchStore(b *testing.B) (redisstore.Store, *roundTrips) {
	b.Helper()
	opt := sharedOptions(b)
	opt.PoolSize = 2 * benchClients
	c := redis.NewClient(opt)
	b.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.WithPrefix(testPrefix(b, c)))
	if err != nil {
		b.Fatal(err)
	}
	// Load the functions before counting.
	ctx := context.Background()
	id := engine.ID{Key: "warm-up"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	s.Extend(ctx, id, cl.Token, time.Minute)
	s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusOK}, time.Minute)
	s.Release(ctx, id, cl.Token)
	counter := &roundTrips{}
	c.AddHook(counter)
	return s, counter
}

// processCPU returns the CPU time that the process has used, user and
// system, in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func benchResponse() *engine.Response {
	return &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:   make([]byte, 1024),
	}
}

// runParallel runs fn on about benchClients goroutines, each with a number
// of its own, and reports the process's CPU time per op (user and system,
// the client's side of each call: the wall time is mostly Redis's and the
// network's) and round trips per op when counter is not nil.
func runParallel(b *testing.B, counter *roundTrips, fn func(g int64, pb *testing.PB)) {
	b.ReportAllocs()
	b.SetParallelism((benchClients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var goroutines atomic.Int64
	if counter != nil {
		counter.n.Store(0)
	}
	b.ResetTimer()
	cpu := processCPU(b)
	b.RunParallel(func(pb *testing.PB) { fn(goroutines.Add(1), pb) })
	b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
	b.StopTimer()
	if counter != nil {
		b.ReportMetric(float64(counter.n.Load())/float64(b.N), "round-trips/op")
	}
}

// BenchmarkClaimComplete is a first execution: a Claim that acquires a new
// key, then a Complete storing a 1 KiB response.
func BenchmarkClaimComplete(b *testing.B) {
	s, counter := benchStore(b)
	ctx := context.Background()
	resp := benchResponse()
	runParallel(b, counter, func(g int64, pb *testing.PB) {
		prefix := strconv.FormatInt(g, 10) + "-"
		for i := 0; pb.Next(); i++ {
			id := engine.ID{Scope: "bench", Key: prefix + strconv.Itoa(i)}
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
			if err != nil || c.Status != engine.Acquired {
				b.Errorf("Claim = %v, %v; want acquired", c.Status, err)
				return
			}
			if err := s.Complete(ctx, id, c.Token, resp, time.Minute); err != nil {
				b.Errorf("Complete error = %v", err)
				return
			}
		}
	})
}

// BenchmarkReplay is a Claim that finds a completed 1 KiB response.
func BenchmarkReplay(b *testing.B) {
	s, counter := benchStore(b)
	ctx := context.Background()
	id := engine.ID{Scope: "bench", Key: "replayed"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, id, c.Token, benchResponse(), time.Minute); err != nil {
		b.Fatal(err)
	}
	runParallel(b, counter, func(_ int64, pb *testing.PB) {
		for pb.Next() {
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
			if err != nil || c.Status != engine.Completed {
				b.Errorf("Claim = %v, %v; want completed", c.Status, err)
				return
			}
		}
	})
}

// BenchmarkReplicaAck is BenchmarkClaimComplete on a private master with a
// replica, without and with WithReplicaAck(1, time.Second): the cost of
// waiting for the replica, as a ratio of the two in one run.
func BenchmarkReplicaAck(b *testing.B) {
	needRedisServer(b)
	master := startRedis(b, "--repl-diskless-sync-delay", "0")
	replica := startRedis(b, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, ContextTimeoutEnabled: true})
	defer rc.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("replica not in sync: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling the replica, with a deadline
	}
	for _, tc := range []struct {
		name string
		opts []redisstore.Option
	}{
		{"without", nil},
		{"WithReplicaAck", []redisstore.Option{redisstore.WithReplicaAck(1, time.Second)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true, PoolSize: 2 * benchClients})
			defer c.Close()
			// The function runs more than once: keys of its own each time.
			prefix := tc.name + ":" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			s, err := redisstore.New(c, append(tc.opts, redisstore.WithPrefix(prefix))...)
			if err != nil {
				b.Fatal(err)
			}
			counter := &roundTrips{}
			c.AddHook(counter)
			resp := benchResponse()
			runParallel(b, counter, func(g int64, pb *testing.PB) {
				prefix := strconv.FormatInt(g, 10) + "-"
				for i := 0; pb.Next(); i++ {
					id := engine.ID{Scope: "bench", Key: prefix + strconv.Itoa(i)}
					cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
					if err != nil || cl.Status != engine.Acquired {
						b.Errorf("Claim = %v, %v; want acquired", cl.Status, err)
						return
					}
					if err := s.Complete(ctx, id, cl.Token, resp, time.Minute); err != nil {
						b.Errorf("Complete error = %v", err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkReplayClientOptions is BenchmarkReplay through clients with
// ContextTimeoutEnabled and without, each call with a deadline, as the
// middleware makes them: what a client without it costs the Store. A
// *redis.Client and a Ring of one shard, the shared Redis; without the
// option the Store calls either through a clone that has it (a Ring's,
// its shard's).
func BenchmarkReplayClientOptions(b *testing.B) {
	for _, tc := range []struct {
		name           string
		ring           bool
		contextTimeout bool
	}{
		{"Client/ContextTimeoutEnabled", false, true}, {"Client/without", false, false},
		{"Ring/ContextTimeoutEnabled", true, true}, {"Ring/without", true, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			opt := sharedOptions(b)
			opt.PoolSize = 2 * benchClients
			opt.ContextTimeoutEnabled = tc.contextTimeout
			var c redis.UniversalClient = redis.NewClient(opt)
			if tc.ring {
				c.Close()
				c = redis.NewRing(&redis.RingOptions{
					Addrs:    map[string]string{"one": opt.Addr},
					Username: opt.Username, Password: opt.Password, DB: opt.DB,
					PoolSize: opt.PoolSize, ContextTimeoutEnabled: tc.contextTimeout,
				})
			}
			b.Cleanup(func() { c.Close() })
			s, err := redisstore.New(c, redisstore.WithPrefix(testPrefix(b, sharedClient(b))))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			id := engine.ID{Scope: "bench", Key: "replayed"}
			cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, id, cl.Token, benchResponse(), time.Minute); err != nil {
				b.Fatal(err)
			}
			// No round trips counted: the Store's clones of a client
			// without ContextTimeoutEnabled run none of its hooks.
			runParallel(b, nil, func(_ int64, pb *testing.PB) {
				for pb.Next() {
					ctx, cancel := context.WithTimeout(ctx, time.Second)
					c, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute)
					cancel()
					if err != nil || c.Status != engine.Completed {
						b.Errorf("Claim = %v, %v; want completed", c.Status, err)
						return
					}
				}
			})
		})
	}
}
