package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// errDown is a store's system failure: it is tried again, and the call is
// refused with ErrStoreUnavailable when it persists.
var errDown = errors.New("store down")

// fakeStore answers Claim from a script, fails its writes as told until it
// is healed, and keeps the one record's state.
type fakeStore struct {
	mu sync.Mutex
	// claims are Claim's answers, in order; the last one repeats.
	claims []engine.Claim
	// claimErr, when set, is Claim's answer instead; with failFrom, from
	// that Claim on, errDown is.
	claimErr error
	failFrom int
	// hang makes Claim wait for its context to end; then it answers
	// with the context's error, or, with late, with its claim anyway, as a
	// store that ignores its context does.
	hang, late bool
	// completeErr and releaseErr are the writes' answers until heal;
	// extendErr is Extend's, and ErrLeaseLost from it loses the lease
	// for every later write too.
	completeErr, releaseErr, extendErr error
	// notStorable refuses a response with a body as ErrNotStorable.
	notStorable bool
	// onClaim, onComplete and onExtend, when set, are called at the start
	// of each call, with the number of calls so far; onComplete's error,
	// if any, is Complete's answer, and onExtend may block.
	onClaim    func(n int)
	onComplete func(n int) error
	onExtend   func(ctx context.Context, n int)
	nCompletes int

	state    string // "", "in flight", "completed", "released"
	stored   *engine.Response
	token    engine.Token
	lost     bool
	nClaims  int
	nExtends int
	ctxValue any // the value under ctxKey of the last write's context
	deadline bool
	ctxErr   error // the last Complete's context's, after onComplete
}

type ctxKey struct{}

func (s *fakeStore) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	if s.hang {
		<-ctx.Done()
		if !s.late {
			return engine.Claim{}, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nClaims++
	if s.onClaim != nil {
		s.onClaim(s.nClaims)
	}
	if s.claimErr != nil {
		return engine.Claim{}, s.claimErr
	}
	if s.failFrom > 0 && s.nClaims >= s.failFrom {
		return engine.Claim{}, errDown
	}
	cl := s.claims[min(s.nClaims, len(s.claims))-1]
	if cl.Status == engine.Acquired {
		s.state, s.token = "in flight", cl.Token
	}
	return cl, nil
}

func (s *fakeStore) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctxValue = ctx.Value(ctxKey{})
	_, s.deadline = ctx.Deadline()
	s.nCompletes++
	if s.onComplete != nil {
		if err := s.onComplete(s.nCompletes); err != nil {
			return fmt.Errorf("fake: complete: %w", err)
		}
	}
	s.ctxErr = ctx.Err()
	switch {
	case s.lost || token != s.token || s.state != "in flight":
		return fmt.Errorf("fake: complete: %w", engine.ErrLeaseLost)
	case s.completeErr != nil:
		return fmt.Errorf("fake: complete: %w", s.completeErr)
	case s.notStorable && len(resp.Body) > 0:
		return fmt.Errorf("fake: complete: %w", engine.ErrNotStorable)
	}
	s.state, s.stored = "completed", resp
	return nil
}

func (s *fakeStore) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctxValue = ctx.Value(ctxKey{})
	switch {
	case s.lost || token != s.token || s.state != "in flight":
		return fmt.Errorf("fake: release: %w", engine.ErrLeaseLost)
	case s.releaseErr != nil:
		return fmt.Errorf("fake: release: %w", s.releaseErr)
	}
	s.state = "released"
	return nil
}

func (s *fakeStore) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	s.mu.Lock()
	s.nExtends++
	n, hook := s.nExtends, s.onExtend
	s.mu.Unlock()
	if hook != nil {
		hook(ctx, n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(s.extendErr, engine.ErrLeaseLost) {
		s.lost = true
	}
	if s.extendErr != nil {
		return fmt.Errorf("fake: extend: %w", s.extendErr)
	}
	return nil
}

// set changes the store's behaviour while calls run.
func (s *fakeStore) set(f func(*fakeStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// extends returns how many times Extend was called.
func (s *fakeStore) extends() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nExtends
}

// heal makes the writes succeed from now on.
func (s *fakeStore) heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.completeErr, s.releaseErr = nil, nil
}

func (s *fakeStore) after() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == "completed" && s.stored.BodyOmitted {
		return "completed, body omitted"
	}
	return s.state
}
