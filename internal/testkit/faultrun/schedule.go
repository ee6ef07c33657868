package faultrun

import (
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"slices"
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

	mu    sync.Mutex
	seen  map[string]uint64           // requests so far, by key
	drawn map[string][]faultnet.Fault // the faults given before calm, by key
}

func newSchedule(seed uint64, drop, reset, delay float64) *schedule {
	return &schedule{seed: seed, drop: drop, reset: reset, delay: delay, seen: map[string]uint64{}, drawn: map[string][]faultnet.Fault{}}
}

// decide is a faultnet.Config.Decide.
func (s *schedule) decide(n int64, r *http.Request) faultnet.Fault {
	key := r.Header.Get("Idempotency-Key")
	// Drawn under the lock, so that a key's faults are recorded in the
	// order of its requests.
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.seen[key]
	s.seen[key] = k + 1
	if s.calm.Load() {
		return faultnet.Pass
	}
	if key == "" {
		// Without a key the arrival order decides, which is not the
		// seed's: nothing to record.
		return s.fault(draw(s.seed, key, uint64(n)))
	}
	f := s.fault(draw(s.seed, key, k))
	s.drawn[key] = append(s.drawn[key], f)
	return f
}

// fault turns a draw into a fault, by the rates.
func (s *schedule) fault(u float64) faultnet.Fault {
	switch {
	case u < s.drop:
		return faultnet.Drop
	case u < s.drop+s.reset:
		return faultnet.Reset
	case u < s.drop+s.reset+s.delay:
		return faultnet.Delay
	}
	return faultnet.Pass
}

// faults returns a copy of the faults given so far to each key's requests,
// in their order, before the schedule was calmed.
func (s *schedule) faults() map[string][]faultnet.Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]faultnet.Fault, len(s.drawn))
	for k, v := range s.drawn {
		out[k] = slices.Clone(v)
	}
	return out
}

// draw returns a number in [0, 1) that depends only on its arguments.
func draw(seed uint64, key string, k uint64) float64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return rand.New(rand.NewPCG(seed, h.Sum64()^(k*0x9e3779b97f4a7c15))).Float64()
}
