package main

import (
	"context"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// histogram counts durations in log-linear buckets, 16 to each power of two
// (within about 6%), without a lock: Claim calls record into it from every
// request's goroutine.
type histogram struct {
	counts [976]atomic.Int64
	max    atomic.Int64
}

func bucketOf(ns int64) int {
	if ns < 16 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1
	return (e-3)*16 + int((ns>>(e-4))&15)
}

// bucketMid returns the middle of bucket i.
func bucketMid(i int) int64 {
	if i < 16 {
		return int64(i)
	}
	e, sub := i/16+3, int64(i%16)
	lo := (16 + sub) << (e - 4)
	return lo + (int64(1)<<(e-4))/2
}

func (h *histogram) record(d time.Duration) {
	ns := int64(d)
	h.counts[bucketOf(ns)].Add(1)
	for {
		m := h.max.Load()
		if ns <= m || h.max.CompareAndSwap(m, ns) {
			return
		}
	}
}

// snapshot returns the counts, and resets them.
func (h *histogram) take() latencySummary {
	var s latencySummary
	for i := range h.counts {
		s.counts[i] = h.counts[i].Swap(0)
		s.n += s.counts[i]
	}
	s.max = time.Duration(h.max.Swap(0))
	return s
}

// latencySummary is a histogram's counts at one moment.
type latencySummary struct {
	counts [976]int64
	n      int64
	max    time.Duration
}

// percentile returns the p-th percentile, to the bucket's middle.
func (s latencySummary) percentile(p float64) time.Duration {
	if s.n == 0 {
		return 0
	}
	want := int64(p / 100 * float64(s.n))
	if want < 1 {
		want = 1
	}
	var seen int64
	for i, c := range s.counts {
		if seen += c; seen >= want {
			return min(time.Duration(bucketMid(i)), s.max)
		}
	}
	return s.max
}

// timedStore is a Store that records how long each Claim takes, and counts
// the claims that acquired.
type timedStore struct {
	engine.Store
	claims   *histogram
	acquired atomic.Int64
}

func (t *timedStore) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	start := time.Now()
	c, err := t.Store.Claim(ctx, id, fingerprint, lease, ttl)
	t.claims.record(time.Since(start))
	if err == nil && c.Status == engine.Acquired {
		t.acquired.Add(1)
	}
	return c, err
}

// timedBinder is a timedStore of a Binder, so that the middleware treats it
// as it treats the store itself.
type timedBinder struct {
	*timedStore
	binder engine.Binder
}

func (t timedBinder) Bind(ctx context.Context, id engine.ID, token engine.Token) context.Context {
	return t.binder.Bind(ctx, id, token)
}

// timed wraps s; the Store it returns is a Binder if s is one.
func timed(s engine.Store) (engine.Store, *timedStore) {
	t := &timedStore{Store: s, claims: &histogram{}}
	if b, ok := s.(engine.Binder); ok {
		return timedBinder{t, b}, t
	}
	return t, t
}
