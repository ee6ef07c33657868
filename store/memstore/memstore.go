// Package memstore is an in-memory engine.Store: the embedded default for an
// API that runs as a single process.
//
// Records live in a sharded map, so that requests for different keys rarely
// contend. Memory is bounded twice over, by a number of records and by a
// number of bytes, and both bounds keep the promise the Store makes:
//
//   - A live record (in flight, or completed and younger than its TTL) is
//     never evicted to make room. Evicting one would let a retry of a request
//     that already ran run again, which is the failure this module exists to
//     prevent.
//   - At the record bound, and when a new record's key and fingerprint would
//     take the store past its byte bound, Claim for a new key fails with
//     ErrFull (after first removing the expired records it can find), so the
//     middleware answers 503 and runs nothing: the API sheds load instead of
//     losing its memory of what it did. Records in flight count toward both
//     bounds.
//   - At the byte bound, Complete keeps the record but drops the response
//     body (the stored Response has BodyOmitted set): the request still
//     never runs twice; its replay says the body was not kept. Headers that
//     alone would take the store past its bound are dropped too. This holds
//     for a response larger than the whole bound, which could never fit:
//     Complete never fails with engine.ErrNotStorable, since it already does,
//     in the same step, what the middleware does on that error.
//
// Every deadline is computed from the caller's duration with saturation: a
// lease or a TTL of math.MaxInt64 never ends, rather than wrapping to a
// deadline in the past.
//
// A Claim that takes over a lease that ran out reports in Claim.Abandoned how
// many holders lost theirs before it. The Store implements engine.Inspector,
// so that an operator can look a record up and settle it (see [Store.Lookup]
// and [Store.Resolve]).
//
// Expired records are removed when they are next touched and by a background
// sweep. Close forgets every record and stops the sweep; every call after it
// fails at once, so that requests still running are answered without waiting
// for the store (see [Store.Close]). Records do not survive a restart and are not
// shared between processes: an API that runs on several machines needs
// pgstore or redisstore.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/steps"
)

// Default bounds. They suit a single API process: a million records, or
// 256 MiB of keys, fingerprints and stored responses.
const (
	defaultMaxRecords    = 1_000_000
	defaultMaxBytes      = 256 << 20
	defaultSweepInterval = time.Minute
)

const (
	shardCount = 64
	// recordOverhead approximates the bytes a record costs beyond its
	// strings and response: the map entry, its ID and record (times,
	// token, counts).
	recordOverhead = 112
	// boundSweepInterval is how often, at most, a Claim that finds the
	// store full sweeps it.
	boundSweepInterval = 100 * time.Millisecond
)

var (
	// ErrFull is returned, wrapped, by Claim when a new record would take
	// the store past its bound on records or on bytes.
	ErrFull = errors.New("store full")
)

// Store is an in-memory engine.Store that keeps steps (engine.StepStore)
// and lets an operator inspect its records (engine.Inspector). Create one
// with New; it is safe for concurrent use. Call Close to stop its
// background sweep.
type Store interface {
	engine.StepStore
	engine.Inspector
	// Close ends the store: it forgets every record, stops the background sweep
	// and waits for it to end. Close is idempotent and always returns nil.
	//
	// A request still running when Close is called is not waited for, and is
	// never held: each method called after Close fails at once with engine.ErrStoreClosed,
	// and a holder's Complete, Release or Extend fails with an error that wraps
	// engine.ErrLeaseLost too, since its lease went with the records. The
	// middleware of package server then treats the lease as lost: its next
	// renewal cancels the handler's context, and the response of a handler that
	// returns is sent at once, without trying to store it, so that an
	// http.Server's Shutdown after Close does not wait for a store timeout or a
	// lease. The records are gone: a request that ran is not remembered
	// by a new Store.
	Close() error
	// Len returns the number of records held, expired ones not yet swept
	// included.
	Len() int
	// Bytes returns the memory, in bytes, that the records are accounted for.
	Bytes() int64
}

// store is the Store that New makes.
type store struct {
	shards     [shardCount]shard
	seed       maphash.Seed
	epoch      time.Time
	maxRecords int64
	maxBytes   int64
	records    atomic.Int64
	bytes      atomic.Int64
	token      atomic.Int64
	// lastBoundSweep is when Claim last swept because the store was full,
	// in Unix nanoseconds.
	lastBoundSweep atomic.Int64

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

type shard struct {
	mu sync.Mutex
	m  map[engine.ID]record
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

// mono is a point in time on the store's monotonic clock: nanoseconds since
// the store was made. It keeps records small.
type mono int64

func (s *store) now() mono { return mono(time.Since(s.epoch)) }

// add returns t + d, saturated: a caller's duration can be as large as
// math.MaxInt64, and a deadline that wrapped into the past would forget a
// record, or end a lease, at once.
func (t mono) add(d time.Duration) mono {
	if d > 0 && t > math.MaxInt64-mono(d) {
		return math.MaxInt64
	}
	return t + mono(d)
}

// wall returns t as a wall-clock time: the store's epoch, read by the wall
// clock, plus t.
func (s *store) wall(t mono) time.Time { return s.epoch.Round(0).Add(time.Duration(t)) }

type record struct {
	fingerprint string
	token       engine.Token
	created     mono             // the record was first claimed
	leaseUntil  mono             // the lease ends
	expiresAt   mono             // the record ends
	resp        *engine.Response // nil while in flight
	size        int64
	abandoned   int32         // holders that lost their lease; -1 after a creator's release that kept steps
	steps       []engine.Step // never changed in place: a Claim's answer may hold it
	stepsSize   int64
}

var (
	_ engine.Store = (*store)(nil)
	_ Store        = (*store)(nil)
)

// Option configures a Store.
type Option func(*config)

type config struct {
	maxRecords    int64
	maxBytes      int64
	sweepInterval time.Duration
	invalid       []error
}

func (c *config) refuse(format string, args ...any) {
	c.invalid = append(c.invalid, fmt.Errorf("memstore: "+format, args...))
}

// WithMaxRecords bounds the number of records kept, 1,000,000 by
// default. It must be at least 1.
func WithMaxRecords(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.refuse("record bound %d is below 1", n)
			return
		}
		c.maxRecords = int64(n)
	}
}

// WithMaxBytes bounds the memory, in bytes, taken by keys, fingerprints and
// stored responses, as the store counts them, 256 MiB by default. It
// must be at least 1. The process's resident memory grows by more than
// that: the collector's headroom (GOGC) and the slack of buffers make it
// about 2 to 3 times the bound when the store is full (measured in
// RELIABILITY.md), so set the bound at a third of the memory the store may
// take.
func WithMaxBytes(n int64) Option {
	return func(c *config) {
		if n < 1 {
			c.refuse("byte bound %d is below 1", n)
			return
		}
		c.maxBytes = n
	}
}

// WithSweepInterval sets how often expired records are removed in the
// background, once a minute by default. It must be at least a
// millisecond.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.refuse("sweep interval %v is shorter than 1ms", d)
			return
		}
		c.sweepInterval = d
	}
}

// New returns an empty Store and starts its background sweep, which runs
// until Close. The options are checked: an invalid one is an error, which
// names every invalid option, and no Store is made.
func New(opts ...Option) (Store, error) {
	c := config{
		maxRecords:    defaultMaxRecords,
		maxBytes:      defaultMaxBytes,
		sweepInterval: defaultSweepInterval,
	}
	for i, o := range opts {
		if o == nil {
			c.refuse("option %d is nil", i)
			continue
		}
		o(&c)
	}
	if err := errors.Join(c.invalid...); err != nil {
		return nil, err
	}
	s := &store{
		seed:       maphash.MakeSeed(),
		epoch:      time.Now(),
		maxRecords: c.maxRecords,
		maxBytes:   c.maxBytes,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[engine.ID]record)
	}
	go s.sweepLoop(c.sweepInterval)
	return s, nil
}

// Close implements Store.
func (s *store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		// Every method checks closed under its shard's lock, so once a
		// shard is cleared here nothing is added to it again.
		for i := range s.shards {
			sh := &s.shards[i]
			sh.mu.Lock()
			for id, r := range sh.m {
				s.remove(sh, id, r)
			}
			sh.mu.Unlock()
		}
	})
	<-s.done
	return nil
}

// Len implements Store.
func (s *store) Len() int { return int(s.records.Load()) }

// Bytes implements Store.
func (s *store) Bytes() int64 { return s.bytes.Load() }

func (s *store) shard(id engine.ID) *shard {
	return &s.shards[maphash.Comparable(s.seed, id)%shardCount]
}

// lock locks the shard of id, unless ctx is done or the store is closed.
// The caller unlocks it.
func (s *store) lock(ctx context.Context, op string, id engine.ID) (*shard, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memstore: %s: %w", op, err)
	}
	sh := s.shard(id)
	sh.mu.Lock()
	if s.closed.Load() {
		sh.mu.Unlock()
		return nil, fmt.Errorf("memstore: %s: %w", op, engine.ErrStoreClosed)
	}
	return sh, nil
}

// Claim implements engine.Store. The lease and the record's life are
// saturated: math.MaxInt64 means "never ends".
func (s *store) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	c, full, err := s.claim(ctx, id, fingerprint, lease, ttl)
	if err == nil && full && s.sweepAtBound() {
		c, full, err = s.claim(ctx, id, fingerprint, lease, ttl)
	}
	if err != nil {
		return engine.Claim{}, err
	}
	if full {
		return engine.Claim{}, fmt.Errorf("memstore: claim: %w", ErrFull)
	}
	return c, nil
}

// claim does Claim's work under the shard's lock. It reports full when a new
// record was needed and there was no room for it.
func (s *store) claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (c engine.Claim, full bool, err error) {
	sh, err := s.lock(ctx, "claim", id)
	if err != nil {
		return engine.Claim{}, false, err
	}
	defer sh.mu.Unlock()
	now := s.now()
	r, ok := sh.m[id]
	if ok && now >= r.expiresAt {
		s.remove(sh, id, r)
		ok = false
	}
	switch {
	case !ok:
		r = record{fingerprint: fingerprint, created: now, size: int64(len(id.Scope)+len(id.Key)+len(fingerprint)) + recordOverhead}
		if s.records.Add(1) > s.maxRecords {
			s.records.Add(-1)
			return engine.Claim{}, true, nil
		}
		if s.bytes.Add(r.size) > s.maxBytes {
			// Claims count toward the byte bound too: without that,
			// keys that are never completed would fill memory.
			s.bytes.Add(-r.size)
			s.records.Add(-1)
			return engine.Claim{}, true, nil
		}
	case r.resp != nil:
		return engine.Claim{Status: engine.Completed, Fingerprint: r.fingerprint, Response: r.resp}, false, nil
	case now < r.leaseUntil:
		return engine.Claim{Status: engine.InFlight, Fingerprint: r.fingerprint, RetryAfter: time.Duration(r.leaseUntil - now)}, false, nil
	case r.fingerprint != fingerprint:
		return engine.Claim{Status: engine.InFlight, Fingerprint: r.fingerprint}, false, nil
	default:
		// The takeover of a holder that never completed nor
		// released its claim.
		if r.abandoned < math.MaxInt32 {
			r.abandoned++
		}
	}
	r.token = engine.Token(s.token.Add(1))
	r.leaseUntil = now.add(lease)
	// The record outlives the lease by the TTL: a holder lost at its
	// lease's end may have done its work then, and the retry must see it.
	r.expiresAt = r.leaseUntil.add(ttl)
	sh.m[id] = r
	return engine.Claim{Status: engine.Acquired, Token: r.token, Abandoned: int(r.abandoned), Steps: r.steps}, false, nil
}

// sweepAtBound sweeps every shard when the store is full, at most once per
// boundSweepInterval, so that a store full of live records does not scan
// itself on every claim. It reports whether it swept.
func (s *store) sweepAtBound() bool {
	now := time.Now()
	last := s.lastBoundSweep.Load()
	if now.UnixNano()-last < int64(boundSweepInterval) || !s.lastBoundSweep.CompareAndSwap(last, now.UnixNano()) {
		return false
	}
	s.sweepAll(s.now())
	return true
}

// Complete implements engine.Store. At the byte bound it keeps the record
// and drops the response body; see the package documentation. So it never
// fails with engine.ErrNotStorable: a response that could never fit, one
// larger than the whole byte bound, is kept without its body in the same
// step, which is what the middleware would do on ErrNotStorable.
func (s *store) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	return s.withLease(ctx, "complete", id, token, func(sh *shard, r record) {
		s.dropSteps(&r)
		resp, size := s.fit(resp)
		now := s.now()
		r.resp = resp
		r.size += size
		r.leaseUntil = now
		r.expiresAt = now.add(ttl)
		sh.m[id] = r
	})
}

// fit accounts for the room resp takes, and returns it, or, when it does
// not fit under the byte bound, a copy without its body, and without its
// headers too if they alone do not fit. The status and the marker are always
// kept, over the bound if need be: forgetting that a request ran would let it
// run twice.
func (s *store) fit(resp *engine.Response) (*engine.Response, int64) {
	size := int64(resp.Size())
	if s.bytes.Add(size) <= s.maxBytes {
		return resp, size
	}
	s.bytes.Add(-size)
	r := &engine.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}
	if size = int64(r.Size()); s.bytes.Add(size) <= s.maxBytes {
		return r, size
	}
	s.bytes.Add(-size)
	r.Header = nil
	size = int64(r.Size())
	s.bytes.Add(size)
	return r, size
}

// Release implements engine.Store. A record the holder's Claim created is
// removed, unless it holds steps; one it took over from lost holders, or
// one that holds steps, goes back to how the Claim found it, with a new
// token: in flight, its lease ended, one holder fewer counted, which the
// next takeover counts again.
func (s *store) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	return s.withLease(ctx, "release", id, token, func(sh *shard, r record) {
		if r.abandoned == 0 && len(r.steps) == 0 {
			s.remove(sh, id, r)
			return
		}
		r.abandoned--
		r.token = engine.Token(s.token.Add(1))
		r.leaseUntil = min(r.leaseUntil, s.now())
		sh.m[id] = r
	})
}

// Extend implements engine.Store. The lease is saturated, as in Claim, and
// the record's expiry moves with the lease's end, keeping the TTL that the
// Claim put between them.
func (s *store) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	return s.withLease(ctx, "extend", id, token, func(sh *shard, r record) {
		slack := time.Duration(r.expiresAt - r.leaseUntil)
		r.leaseUntil = s.now().add(lease)
		r.expiresAt = max(r.expiresAt, r.leaseUntil.add(slack))
		sh.m[id] = r
	})
}

// SaveStep implements engine.StepStore. A step's bytes count toward the
// byte bound, as a response's do; at the bound the step is refused with an
// error wrapping ErrFull and engine.ErrNotStorable.
func (s *store) SaveStep(ctx context.Context, id engine.ID, token engine.Token, step engine.Step) error {
	if size := len(step.Name) + len(step.Fingerprint) + len(step.Result); size > steps.MaxSize {
		return fmt.Errorf("memstore: save step: %d bytes, over %d: %w", size, steps.MaxSize, engine.ErrNotStorable)
	}
	var err error
	lerr := s.withLease(ctx, "save step", id, token, func(sh *shard, r record) {
		i := slices.IndexFunc(r.steps, func(st engine.Step) bool { return st.Name == step.Name })
		list := slices.Clone(r.steps)
		var freed int64
		if i >= 0 {
			freed = stepSize(list[i])
			list = slices.Delete(list, i, i+1)
		}
		if step.Fingerprint != "" {
			if len(list) >= steps.MaxSteps {
				err = fmt.Errorf("memstore: save step: more than %d steps: %w", steps.MaxSteps, engine.ErrNotStorable)
				return
			}
			step.Result = slices.Clone(step.Result)
			list = append(list, step)
		}
		grown := -freed
		if step.Fingerprint != "" {
			grown += stepSize(step)
		}
		if s.bytes.Add(grown) > s.maxBytes && grown > 0 {
			s.bytes.Add(-grown)
			err = fmt.Errorf("memstore: save step: %w: %w", ErrFull, engine.ErrNotStorable)
			return
		}
		if len(list) == 0 {
			list = nil
		}
		r.steps, r.stepsSize, r.size = list, r.stepsSize+grown, r.size+grown
		sh.m[id] = r
	})
	if lerr != nil {
		return lerr
	}
	return err
}

// stepSize is the room a step takes.
func stepSize(st engine.Step) int64 {
	return int64(len(st.Name)+len(st.Fingerprint)+len(st.Result)) + stepOverhead
}

// stepOverhead is an estimate of the bytes a step takes beyond its own.
const stepOverhead = 64

// dropSteps removes r's steps and returns their room.
func (s *store) dropSteps(r *record) {
	if r.steps == nil {
		return
	}
	s.bytes.Add(-r.stepsSize)
	r.size -= r.stepsSize
	r.steps, r.stepsSize = nil, 0
}

// withLease runs fn, under the shard's lock, on the in-flight record that
// token holds, or fails with ErrLeaseLost.
func (s *store) withLease(ctx context.Context, op string, id engine.ID, token engine.Token, fn func(*shard, record)) error {
	sh, err := s.lock(ctx, op, id)
	if errors.Is(err, engine.ErrStoreClosed) {
		// The lease went with the records: say so, so that a holder
		// stops trying at once.
		return fmt.Errorf("%w: %w", err, engine.ErrLeaseLost)
	}
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	r, err := s.current(sh, id, token)
	if err != nil {
		return fmt.Errorf("memstore: %s: %w", op, err)
	}
	fn(sh, r)
	return nil
}

// current returns the in-flight record that token holds. sh.mu is held.
func (s *store) current(sh *shard, id engine.ID, token engine.Token) (record, error) {
	r, ok := sh.m[id]
	if !ok || r.token != token || r.resp != nil || s.now() >= r.expiresAt {
		return record{}, engine.ErrLeaseLost
	}
	return r, nil
}

// remove deletes a record and returns its room. sh.mu is held.
func (s *store) remove(sh *shard, id engine.ID, r record) {
	delete(sh.m, id)
	s.records.Add(-1)
	s.bytes.Add(-r.size)
}

// sweepShard removes the expired records of one shard. sh.mu is held.
func (s *store) sweepShard(sh *shard, now mono) {
	for id, r := range sh.m {
		if now >= r.expiresAt {
			s.remove(sh, id, r)
		}
	}
}

func (s *store) sweepAll(now mono) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.sweepShard(sh, now)
		sh.mu.Unlock()
	}
}

func (s *store) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweepAll(s.now())
		}
	}
}
