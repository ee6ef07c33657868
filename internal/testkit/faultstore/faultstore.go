// Package faultstore wraps a engine.Store so that tests can make any of its
// operations fail, hang or slow down, and count the calls. It is for tests of
// what the middleware does when its store misbehaves.
package faultstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Op names one of the Store's operations.
type Op int

// The operations of a engine.Store.
const (
	Claim Op = iota
	Complete
	Release
	Extend
	numOps
)

// String returns the operation's name.
func (op Op) String() string {
	switch op {
	case Claim:
		return "claim"
	case Complete:
		return "complete"
	case Release:
		return "release"
	case Extend:
		return "extend"
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// Fault is what happens to a call. The zero Fault passes it through.
type Fault struct {
	// Delay waits this long (or until the context is done) before the call
	// goes on.
	Delay time.Duration
	// Hang blocks the call until its context is done, and returns the
	// context's error, as a store that does not answer would.
	Hang bool
	// Err fails the call with this error, without passing it on.
	Err error
	// ErrAfter passes the call on, then fails it with this error whatever
	// the inner store answered: the operation happened, but its answer was
	// lost.
	ErrAfter error
	// Times limits the fault to this many calls; zero means every call.
	Times int
}

func (f Fault) none() bool {
	return f.Delay == 0 && !f.Hang && f.Err == nil && f.ErrAfter == nil
}

// Store is a engine.Store that injects faults into an inner Store. Its
// methods are safe for concurrent use.
type Store struct {
	inner engine.Store

	mu     sync.Mutex
	faults [numOps]Fault
	calls  [numOps]int
	hit    [numOps]int // calls the fault applied to
}

var _ engine.Store = (*Store)(nil)

// New wraps inner, with no faults set.
func New(inner engine.Store) *Store { return &Store{inner: inner} }

// Set makes op's calls suffer f from now on, replacing any fault set before.
func (s *Store) Set(op Op, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[op] = f
	s.hit[op] = 0
}

// Clear removes op's fault.
func (s *Store) Clear(op Op) { s.Set(op, Fault{}) }

// Calls returns how many times op was called.
func (s *Store) Calls(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// Faulted returns how many of op's calls its current fault applied to.
func (s *Store) Faulted(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hit[op]
}

// fault counts a call of op and returns the fault that applies to it.
func (s *Store) fault(op Op) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[op]++
	f := s.faults[op]
	if f.none() || (f.Times > 0 && s.hit[op] >= f.Times) {
		return Fault{}
	}
	s.hit[op]++
	return f
}

// do runs call under op's fault.
func (s *Store) do(ctx context.Context, op Op, call func() error) error {
	f := s.fault(op)
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("faultstore: %s: %w", op, ctx.Err())
		case <-t.C:
		}
	}
	if f.Hang {
		<-ctx.Done()
		return fmt.Errorf("faultstore: %s: %w", op, ctx.Err())
	}
	if f.Err != nil {
		return fmt.Errorf("faultstore: %s: %w", op, f.Err)
	}
	err := call()
	if f.ErrAfter != nil {
		return fmt.Errorf("faultstore: %s: %w", op, f.ErrAfter)
	}
	return err
}

// Claim implements engine.Store.
func (s *Store) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	var c engine.Claim
	err := s.do(ctx, Claim, func() (err error) {
		c, err = s.inner.Claim(ctx, id, fingerprint, lease, ttl)
		return err
	})
	if err != nil {
		return engine.Claim{}, err
	}
	return c, nil
}

// Complete implements engine.Store.
func (s *Store) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	return s.do(ctx, Complete, func() error { return s.inner.Complete(ctx, id, token, resp, ttl) })
}

// Release implements engine.Store.
func (s *Store) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	return s.do(ctx, Release, func() error { return s.inner.Release(ctx, id, token) })
}

// Extend implements engine.Store.
func (s *Store) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	return s.do(ctx, Extend, func() error { return s.inner.Extend(ctx, id, token, lease) })
}
