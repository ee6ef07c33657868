package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// work is what the fake door's work does.
type work int

const (
	keep         work = iota + 1 // answers 200, to be kept
	keepSent                     // answers 200, already sent (streamed)
	giveBack                     // answers 500: the key is released
	giveBackSent                 // answers 500, already sent
	panics                       // panics
	outlive                      // waits for its context, which only a lost lease ends
	callerLeaves                 // its caller goes away, and it gives up
	custom                       // fakeDoor.run
)

// fakeDoor records the engine's calls, in order, as the table writes
// them.
type fakeDoor struct {
	call   engine.Call
	work   work
	leave  context.CancelFunc // the caller's, for callerLeaves
	store  *fakeStore
	run    func(ctx context.Context) engine.Outcome // the custom work
	calls  []string
	lease  engine.Lease // the lease the work saw
	leased bool
	ctx    context.Context // the work's
}

func (d *fakeDoor) Replay(resp *engine.Response) int {
	d.calls = append(d.calls, "Replay")
	return resp.Status
}

func (d *fakeDoor) Refuse(kind error, retryAfter time.Duration, cause error) int {
	switch kind {
	case engine.ErrInFlight:
		d.calls = append(d.calls, fmt.Sprintf("Refuse(in flight, %v)", retryAfter))
		return 409
	case engine.ErrKeyMismatch:
		d.calls = append(d.calls, "Refuse(mismatch)")
		return 422
	case engine.ErrStoreUnavailable:
		d.calls = append(d.calls, fmt.Sprintf("Refuse(unavailable, %v)", retryAfter))
		return 503
	}
	d.calls = append(d.calls, fmt.Sprintf("Refuse(%v)", kind))
	return 500
}

func (d *fakeDoor) Execute(ctx context.Context) engine.Outcome {
	d.calls = append(d.calls, "Execute")
	d.ctx = ctx
	d.lease, d.leased = engine.LeaseFromContext(ctx)
	kept := &engine.Response{Status: 200, Body: []byte("done")}
	switch d.work {
	case keep:
		return engine.Outcome{Response: kept, Status: 200}
	case keepSent:
		return engine.Outcome{Response: kept, Status: 200, Sent: true}
	case giveBack:
		return engine.Outcome{Status: 500, Reason: "status 500"}
	case giveBackSent:
		return engine.Outcome{Status: 500, Reason: "status 500", Sent: true}
	case panics:
		panic("the work panicked")
	case outlive:
		select {
		case <-ctx.Done():
			return engine.Outcome{Reason: "gave up", Cause: context.Cause(ctx)}
		case <-time.After(10 * time.Second):
			return engine.Outcome{Status: 599, Reason: "the lease was never lost"}
		}
	case callerLeaves:
		d.leave()
		return engine.Outcome{Reason: "gave up", Cause: context.Cause(ctx)}
	case custom:
		return d.run(ctx)
	}
	panic("unknown work")
}

// Send records what the store kept when the caller was answered.
func (d *fakeDoor) Send(now bool) {
	call := "Send"
	if now {
		call = "Send(now)"
	}
	d.calls = append(d.calls, call+" ("+d.store.after()+")")
}

func (d *fakeDoor) OutcomeUnknown() *engine.Response {
	d.calls = append(d.calls, "OutcomeUnknown")
	return &engine.Response{Status: 409, Header: map[string][]string{engine.HeaderOutcome: {"unknown"}}}
}

func (d *fakeDoor) Unprotected() { d.calls = append(d.calls, "Unprotected") }

// events records what the observer is told.
type events struct {
	mu  sync.Mutex
	all []engine.Event
}

func (r *events) observe(ctx context.Context, ev engine.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, ev)
}

// kinds returns the kinds of the events, lease renewals left out.
func (r *events) kinds() []engine.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []engine.EventKind
	for _, ev := range r.all {
		if ev.Kind != engine.EventLeaseRenewed {
			ks = append(ks, ev.Kind)
		}
	}
	return ks
}

// final returns the call's final event: the last that is not about the
// lease or the claim's acquisition.
func (r *events) final() (engine.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.all) - 1; i >= 0; i-- {
		switch r.all[i].Kind {
		case engine.EventLeaseRenewed, engine.EventLeaseLost, engine.EventAcquired:
			continue
		}
		return r.all[i], true
	}
	return engine.Event{}, false
}

// do runs one call through d, and returns what it panicked with.
func do(ctx context.Context, e *engine.Engine, id engine.ID, fp string, d *fakeDoor) (panicked any) {
	defer func() { panicked = recover() }()
	e.Do(ctx, &d.call, id, fp, d)
	return nil
}

// shutdown shuts e down, and fails t if the late writes do not end.
func shutdown(t *testing.T, e *engine.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown = %v, want nil: a late write did not end", err)
	}
}

// logs records the messages the engine logs.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }

func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

func (l *logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logs) WithGroup(string) slog.Handler      { return l }

// count returns how many messages contain part.
func (l *logs) count(part string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, part) {
			n++
		}
	}
	return n
}

// slogOf returns a logger that records into l.
func slogOf(l *logs) *slog.Logger { return slog.New(l) }
