package faultrun

import (
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
)

// schedule gives each request its network fault from the seed, the
// request's idempotency key and the number of requests with that key that
// came before it. The faults an order meets therefore depend on the seed
// alone, not on how the run's goroutines happen to interleave: under one
// seed, the third request for order 42 is dropped on every run.
type schedule struct {
	seed               uint64
	drop, reset, delay float64

	calm atomic.Bool // once set, every request passes

	mu   sync.Mutex
	seen map[string]uint64 // requests so far, by key
}

func newSchedule(seed uint64, drop, reset, delay float64) *schedule {
	return &schedule{seed: seed, drop: drop, reset: reset, delay: delay, seen: map[string]uint64{}}
}

// decide is a faultnet.Config.Decide.
func (s *schedule) decide(n int64, r *http.Request) faultnet.Fault {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	k := s.seen[key]
	s.seen[key] = k + 1
	s.mu.Unlock()
	if s.calm.Load() {
		return faultnet.Pass
	}
	if key == "" {
		k = uint64(n)
	}
	switch u := draw(s.seed, key, k); {
	case u < s.drop:
		return faultnet.Drop
	case u < s.drop+s.reset:
		return faultnet.Reset
	case u < s.drop+s.reset+s.delay:
		return faultnet.Delay
	}
	return faultnet.Pass
}

// draw returns a number in [0, 1) that depends only on its arguments.
func draw(seed uint64, key string, k uint64) float64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return rand.New(rand.NewPCG(seed, h.Sum64()^(k*0x9e3779b97f4a7c15))).Float64()
}
