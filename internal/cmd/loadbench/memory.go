package main

import (
	"context"
	"net/http"
	"runtime"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/store/memstore"
)

// memoryBench runs memstore. Its records live in this process, whose CPU
// time every phase measures, and the collector's work grows with them: so
// the store is built and filled before each of its phases and dropped after,
// and the other stores' phases run without it.
type memoryBench struct {
	replayKey string
	n         int
	store     memstore.Store
	h         http.Handler
}

func newMemoryBench(replayKey string) *memoryBench { return &memoryBench{replayKey: replayKey} }

func (m *memoryBench) name() string { return benchreport.Memory }

// newStore returns a memstore with bounds far above what a run stores: a
// store at its bound answers 503, which is not what is measured here.
func newMemstore(opts ...memstore.Option) (memstore.Store, error) {
	return memstore.New(append([]memstore.Option{
		memstore.WithMaxRecords(1 << 30), memstore.WithMaxBytes(1 << 40),
	}, opts...)...)
}

func (m *memoryBench) fill(ctx context.Context, n int) ([]benchreport.SizeItem, error) {
	m.n = n
	if n == 0 {
		return nil, nil
	}
	var before, after runtime.MemStats
	collect := func(ms *runtime.MemStats) {
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(ms)
	}
	collect(&before)
	s, err := newMemstore()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := prefillMemory(ctx, s, n, time.Hour); err != nil {
		return nil, err
	}
	collect(&after)
	runtime.KeepAlive(s)
	return []benchreport.SizeItem{
		{What: "heap", BytesPerRecord: float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)},
		{What: "accounted", BytesPerRecord: float64(s.Bytes()) / float64(s.Len())},
	}, nil
}

// prefillMemory stores n completed records, as the middleware would store
// the handler's answer, each expiring after ttl.
func prefillMemory(ctx context.Context, s memstore.Store, n int, ttl time.Duration) error {
	return prefillMemoryUntil(ctx, s, n, func() time.Duration { return ttl })
}

// prefillMemoryUntil stores n completed records, each expiring after what
// ttl returns when it is stored.
func prefillMemoryUntil(ctx context.Context, s memstore.Store, n int, ttl func() time.Duration) error {
	for i := 1; i <= n; i++ {
		resp, fp := storedResponse(), string(make([]byte, 32))
		id := engine.ID{Key: prefillKey(i)}
		d := ttl()
		c, err := s.Claim(ctx, id, fp, d, d)
		if err != nil {
			return err
		}
		if err := s.Complete(ctx, id, c.Token, resp, d); err != nil {
			return err
		}
	}
	return nil
}

func (m *memoryBench) beforePhase(ctx context.Context) error {
	s, err := newMemstore()
	if err != nil {
		return err
	}
	if err := prefillMemory(ctx, s, m.n, time.Hour); err != nil {
		s.Close()
		return err
	}
	h, err := newMiddleware(s)
	if err == nil {
		err = seedReplay(h, m.replayKey)
	}
	if err != nil {
		s.Close()
		return err
	}
	m.store, m.h = s, h
	return nil
}

func (m *memoryBench) afterPhase(context.Context, string, string, int64) error {
	m.close()
	return nil
}

func (m *memoryBench) handler() http.Handler { return m.h }

// meters has nothing to read: memstore runs in this process.
func (m *memoryBench) meters() meters { return meters{} }

func (m *memoryBench) close() {
	if m.store != nil {
		m.store.Close()
		m.store, m.h = nil, nil
	}
}
