package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// The claim's answers that the table below starts from.
var (
	fresh    = engine.Claim{Status: engine.Acquired, Token: 7}
	takeover = engine.Claim{Status: engine.Acquired, Token: 8, Abandoned: 2}
	// takeoverSteps took over from lost holders that recorded steps.
	takeoverSteps = engine.Claim{Status: engine.Acquired, Token: 8, Abandoned: 2, Steps: []engine.Step{{Name: "charge", Fingerprint: "f", Done: true, Result: []byte("v1")}}}
	live          = engine.Claim{Status: engine.InFlight, Fingerprint: "fp", RetryAfter: 500 * time.Millisecond}
	// unseen is in flight in a transactional store whose holder has not
	// committed: the store cannot see its fingerprint.
	unseen = engine.Claim{Status: engine.InFlight, RetryAfter: 500 * time.Millisecond}
	// expiredOther is in flight, its lease over, for another request:
	// the store does not let this one take it over.
	expiredOther = engine.Claim{Status: engine.InFlight, Fingerprint: "other"}
	stored       = engine.Claim{Status: engine.Completed, Fingerprint: "fp", Response: &engine.Response{Status: 201, Body: []byte("stored")}}
	storedOther  = engine.Claim{Status: engine.Completed, Fingerprint: "other", Response: &engine.Response{Status: 201}}
	noResponse   = engine.Claim{Status: engine.Completed, Fingerprint: "fp"}
	badStatus    = engine.Claim{Status: 42}
)

// want is what a call must come to: the door's calls in order, the final
// event, and the record the store is left with once the late writes are
// done.
type want struct {
	door     []string
	kind     engine.EventKind
	status   int
	err      error // the final event's Err matches it (errors.Is); nil: no Err
	acquired bool  // the final event says the call held the key
	after    string
}

// protocolRow is one call: the claim's answer and the configuration, the
// work and the store's writes, and what the call must come to.
type protocolRow struct {
	name     string
	claims   []engine.Claim
	claimErr error
	hang     bool // the Claim answers only when its context ends
	late     bool // ... and then with its claim
	cfg      func(*engine.Config)
	gone     bool // the caller is gone before the call
	work     work
	store    func(*fakeStore)
	want     want
}

// TestProtocol is the engine's specification: for each answer of the
// store's Claim (the rows of claimRows) and, when the claim acquires the key, for
// each outcome of the work and of the store writes after it (workRows, run
// once on a fresh key and once on a key taken over under RerunAbandoned),
// the door's calls, in order, the final Event, and what the store keeps.
func TestProtocol(t *testing.T) {
	var rows []protocolRow
	rows = append(rows, claimRows...)
	for _, cl := range []struct {
		name  string
		claim engine.Claim
	}{{"fresh", fresh}, {"takeover, rerun", takeover}} {
		for _, r := range workRows {
			r.name = cl.name + "/" + r.name
			r.claims = []engine.Claim{cl.claim}
			r.want.acquired = true
			rows = append(rows, r)
		}
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) { runRow(t, r) })
	}
}

// claimRows: what the claim's answer decides, whatever the work would do.
var claimRows = []protocolRow{
	{name: "completed, same request", claims: []engine.Claim{stored},
		want: want{door: []string{"Replay"}, kind: engine.EventReplayed, status: 201}},
	{name: "completed, other request", claims: []engine.Claim{storedOther},
		want: want{door: []string{"Refuse(mismatch)"}, kind: engine.EventMismatch, status: 422}},
	{name: "completed without its response", claims: []engine.Claim{noResponse},
		want: want{door: []string{"Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: errAny}},
	{name: "unknown status", claims: []engine.Claim{badStatus},
		want: want{door: []string{"Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: errAny}},
	{name: "in flight, live lease: Retry-After is what the lease has left", claims: []engine.Claim{live},
		want: want{door: []string{"Refuse(in flight, 500ms)"}, kind: engine.EventInFlight, status: 409}},
	{name: "in flight, live lease longer than Config.RetryAfter", claims: []engine.Claim{{Status: engine.InFlight, Fingerprint: "fp", RetryAfter: time.Hour}},
		want: want{door: []string{"Refuse(in flight, 2s)"}, kind: engine.EventInFlight, status: 409}},
	{name: "in flight, fingerprint not visible yet", claims: []engine.Claim{unseen},
		want: want{door: []string{"Refuse(in flight, 500ms)"}, kind: engine.EventInFlight, status: 409}},
	{name: "in flight, expired lease of another request", claims: []engine.Claim{expiredOther},
		want: want{door: []string{"Refuse(mismatch)"}, kind: engine.EventMismatch, status: 422}},
	{name: "in flight, expired lease of another request, with Wait", claims: []engine.Claim{expiredOther},
		cfg:  func(c *engine.Config) { c.Wait = time.Hour },
		want: want{door: []string{"Refuse(mismatch)"}, kind: engine.EventMismatch, status: 422}},
	{name: "in flight with Wait, the holder completes", claims: []engine.Claim{live, live, stored},
		cfg:  func(c *engine.Config) { c.Wait = time.Hour },
		want: want{door: []string{"Replay"}, kind: engine.EventReplayed, status: 201}},
	{name: "in flight with Wait, the holder releases", claims: []engine.Claim{live, fresh}, work: keep,
		cfg:  func(c *engine.Config) { c.Wait = time.Hour },
		want: want{door: []string{"Execute", "Send (completed)"}, kind: engine.EventExecuted, status: 200, acquired: true, after: "completed"}},
	{name: "in flight with Wait, the holder is still there at its end", claims: []engine.Claim{live},
		cfg:  func(c *engine.Config) { c.Wait = 30 * time.Millisecond },
		want: want{door: []string{"Refuse(in flight, 500ms)"}, kind: engine.EventInFlight, status: 409}},
	{name: "in flight with Wait, the store fails while waiting", claims: []engine.Claim{live},
		cfg:   func(c *engine.Config) { c.Wait = time.Hour },
		store: func(s *fakeStore) { s.failFrom = 2 },
		want:  want{door: []string{"Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: errDown}},
	{name: "store error", claimErr: errDown,
		want: want{door: []string{"Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: errDown}},
	{name: "store timeout", hang: true,
		want: want{door: []string{"Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: context.DeadlineExceeded}},
	{name: "store error, FailOpen", claimErr: errDown, cfg: func(c *engine.Config) { c.FailOpen = true },
		want: want{door: []string{"Unprotected"}, kind: engine.EventUnprotected, err: errDown}},
	{name: "store timeout, FailOpen", hang: true, cfg: func(c *engine.Config) { c.FailOpen = true },
		want: want{door: []string{"Unprotected"}, kind: engine.EventUnprotected, err: context.DeadlineExceeded}},
	{name: "acquired, FailOpen: protected as ever", claims: []engine.Claim{fresh}, work: keep, cfg: func(c *engine.Config) { c.FailOpen = true },
		want: want{door: []string{"Execute", "Send (completed)"}, kind: engine.EventExecuted, status: 200, acquired: true, after: "completed"}},
	{name: "store error, the caller gone", claimErr: errDown, gone: true,
		want: want{kind: engine.EventClientGone, err: errDown}},
	{name: "acquired, the caller gone: nothing runs, the key is released", claims: []engine.Claim{fresh}, work: keep, gone: true,
		want: want{kind: engine.EventClientGone, acquired: true, after: "released"}},
	{name: "acquired after the lease it grants ended", claims: []engine.Claim{fresh}, work: keep, hang: true, late: true,
		cfg:  func(c *engine.Config) { c.Lease, c.StoreTimeout = 60*time.Millisecond, time.Second },
		want: want{door: []string{"Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: errAny, acquired: true, after: "released"}},
	{name: "takeover, RefuseAbandoned: outcome unknown, stored and sent", claims: []engine.Claim{takeover}, work: keep,
		cfg:  func(c *engine.Config) { c.Abandoned = engine.RefuseAbandoned },
		want: want{door: []string{"OutcomeUnknown", "Send (completed)"}, kind: engine.EventOutcomeUnknown, status: 409, acquired: true, after: "completed"}},
	{name: "takeover, RefuseAbandoned, Complete fails: refused, the key kept", claims: []engine.Claim{takeover}, work: keep,
		cfg:   func(c *engine.Config) { c.Abandoned = engine.RefuseAbandoned },
		store: func(s *fakeStore) { s.completeErr = errDown },
		want:  want{door: []string{"OutcomeUnknown", "Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: errDown, acquired: true, after: "in flight"}},
	{name: "takeover, RefuseAbandoned, Complete finds the lease lost", claims: []engine.Claim{takeover}, work: keep,
		cfg:   func(c *engine.Config) { c.Abandoned = engine.RefuseAbandoned },
		store: func(s *fakeStore) { s.lost = true },
		want:  want{door: []string{"OutcomeUnknown", "Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: engine.ErrLeaseLost, acquired: true, after: "in flight"}},
	{name: "takeover with steps, RefuseAbandoned: resumed", claims: []engine.Claim{takeoverSteps}, work: keep,
		cfg:  func(c *engine.Config) { c.Abandoned = engine.RefuseAbandoned },
		want: want{door: []string{"Execute", "Send (completed)"}, kind: engine.EventExecuted, status: 200, acquired: true, after: "completed"}},
	{name: "takeover with steps, RerunAbandoned: runs", claims: []engine.Claim{takeoverSteps}, work: keep,
		want: want{door: []string{"Execute", "Send (completed)"}, kind: engine.EventExecuted, status: 200, acquired: true, after: "completed"}},
	{name: "fresh, RefuseAbandoned: runs", claims: []engine.Claim{fresh}, work: keep,
		cfg:  func(c *engine.Config) { c.Abandoned = engine.RefuseAbandoned },
		want: want{door: []string{"Execute", "Send (completed)"}, kind: engine.EventExecuted, status: 200, acquired: true, after: "completed"}},
}

// workRows: what the work and the store writes after it decide, once the
// claim acquired the key.
var workRows = []protocolRow{
	{name: "keep", work: keep,
		want: want{door: []string{"Execute", "Send (completed)"}, kind: engine.EventExecuted, status: 200, after: "completed"}},
	{name: "keep, already sent", work: keepSent,
		want: want{door: []string{"Execute"}, kind: engine.EventExecuted, status: 200, after: "completed"}},
	{name: "release", work: giveBack,
		want: want{door: []string{"Execute", "Send (released)"}, kind: engine.EventReleased, status: 500, after: "released"}},
	{name: "release, already sent", work: giveBackSent,
		want: want{door: []string{"Execute"}, kind: engine.EventReleased, status: 500, after: "released"}},
	{name: "panic: released, and the panic goes on", work: panics,
		want: want{door: []string{"Execute"}, kind: engine.EventReleased, after: "released"}},
	{name: "lease lost: the work's context ends, the caller is refused", work: outlive,
		cfg:   func(c *engine.Config) { c.Lease = 150 * time.Millisecond },
		store: func(s *fakeStore) { s.extendErr = engine.ErrLeaseLost },
		want:  want{door: []string{"Execute", "Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: engine.ErrLeaseLost, after: "in flight"}},
	{name: "lease not renewed: the work's context ends at its end", work: outlive,
		cfg:   func(c *engine.Config) { c.Lease = 150 * time.Millisecond },
		store: func(s *fakeStore) { s.extendErr = errDown },
		want:  want{door: []string{"Execute", "Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: engine.ErrLeaseExpired, after: "released"}},
	{name: "the caller leaves, the work gives up: released, no answer", work: callerLeaves,
		want: want{door: []string{"Execute"}, kind: engine.EventReleased, err: context.Canceled, after: "released"}},
	{name: "Complete finds the lease lost: answered, not stored", work: keep,
		store: func(s *fakeStore) { s.completeErr = engine.ErrLeaseLost },
		want:  want{door: []string{"Execute", "Send (in flight)"}, kind: engine.EventNotStored, status: 200, err: engine.ErrLeaseLost, after: "in flight"}},
	{name: "Complete fails: answered, then stored late", work: keep,
		store: func(s *fakeStore) { s.completeErr = errDown },
		want:  want{door: []string{"Execute", "Send (in flight)"}, kind: engine.EventNotStored, status: 200, err: errDown, after: "completed"}},
	{name: "Complete fails, already sent: stored late", work: keepSent,
		store: func(s *fakeStore) { s.completeErr = errDown },
		want:  want{door: []string{"Execute"}, kind: engine.EventNotStored, status: 200, err: errDown, after: "completed"}},
	{name: "Complete not committed: refused, not answered", work: keep,
		store: func(s *fakeStore) { s.completeErr = engine.ErrNotCommitted },
		want:  want{door: []string{"Execute", "Refuse(unavailable, 2s)"}, kind: engine.EventUnavailable, status: 503, err: engine.ErrNotCommitted, after: "in flight"}},
	{name: "Complete finds the store closed", work: keep,
		store: func(s *fakeStore) { s.completeErr = engine.ErrStoreClosed },
		want:  want{door: []string{"Execute", "Send (in flight)"}, kind: engine.EventNotStored, status: 200, err: engine.ErrStoreClosed, after: "in flight"}},
	{name: "response not storable: stored without its body", work: keep,
		store: func(s *fakeStore) { s.notStorable = true },
		want:  want{door: []string{"Execute", "Send (completed, body omitted)"}, kind: engine.EventExecuted, status: 200, after: "completed, body omitted"}},
	{name: "Release fails: answered, then released late", work: giveBack,
		store: func(s *fakeStore) { s.releaseErr = errDown },
		want:  want{door: []string{"Execute", "Send (in flight)"}, kind: engine.EventReleased, status: 500, after: "released"}},
	{name: "Release finds the lease lost", work: giveBack,
		store: func(s *fakeStore) { s.releaseErr = engine.ErrLeaseLost },
		want:  want{door: []string{"Execute", "Send (in flight)"}, kind: engine.EventReleased, status: 500, after: "in flight"}},
	{name: "panic, Release fails: released late", work: panics,
		store: func(s *fakeStore) { s.releaseErr = errDown },
		want:  want{door: []string{"Execute"}, kind: engine.EventReleased, after: "released"}},
}

// quiet is the tests' logger: the engine logs every store failure.
var quiet = slog.New(slog.DiscardHandler)

// errAny stands for an error the engine makes itself: the final event must
// carry one.
var errAny = errors.New("any error")

func runRow(t *testing.T, r protocolRow) {
	store := &fakeStore{claims: r.claims, claimErr: r.claimErr, hang: r.hang, late: r.late}
	if r.store != nil {
		r.store(store)
	}
	cfg := engine.Config{StoreTimeout: 50 * time.Millisecond, RetryAfter: 2 * time.Second, Logger: quiet}
	if r.cfg != nil {
		r.cfg(&cfg)
	}
	var evs events
	cfg.Observer = evs.observe
	e, err := engine.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	if r.gone {
		leave()
	}
	d := &fakeDoor{work: r.work, leave: leave, store: store}
	panicked := do(ctx, e, engine.ID{Scope: "s", Key: "k"}, "fp", d)
	store.heal()
	shutdown(t, e)

	if (panicked != nil) != (r.work == panics) {
		t.Errorf("Do panicked with %v; work %v", panicked, r.work)
	}
	if !slices.Equal(d.calls, r.want.door) {
		t.Errorf("door calls = %q, want %q", d.calls, r.want.door)
	}
	ev, ok := evs.final()
	if !ok {
		t.Fatalf("no final event; events %v", evs.kinds())
	}
	if ev.Kind != r.want.kind || ev.Status != r.want.status || ev.Acquired != r.want.acquired {
		t.Errorf("final event = %v, status %d, acquired %v; want %v, %d, %v", ev.Kind, ev.Status, ev.Acquired, r.want.kind, r.want.status, r.want.acquired)
	}
	switch {
	case r.want.err == nil && ev.Err != nil:
		t.Errorf("final event's Err = %v, want nil", ev.Err)
	case r.want.err == errAny && ev.Err == nil:
		t.Error("final event's Err = nil, want one")
	case r.want.err != nil && r.want.err != errAny && !errors.Is(ev.Err, r.want.err):
		t.Errorf("final event's Err = %v, want %v", ev.Err, r.want.err)
	}
	if ev.Scope != "s" || ev.Key != "k" {
		t.Errorf("final event names %q/%q, want s/k", ev.Scope, ev.Key)
	}
	if got := store.after(); got != r.want.after {
		t.Errorf("the store keeps %q, want %q", got, r.want.after)
	}
	kinds := evs.kinds()
	if r.want.acquired != slices.Contains(kinds, engine.EventAcquired) {
		t.Errorf("events %v: EventAcquired there = %v, want %v", kinds, !r.want.acquired, r.want.acquired)
	}
	if r.want.acquired && slices.Contains(d.calls, "Execute") {
		if !d.leased || d.lease.Token != r.claims[len(r.claims)-1].Token || d.lease.Abandoned != r.claims[len(r.claims)-1].Abandoned {
			t.Errorf("the work saw lease %+v (%v), want the claim's token and abandoned count", d.lease, d.leased)
		}
	}
	if lost := slices.Contains(kinds, engine.EventLeaseLost); lost != (r.work == outlive) {
		t.Errorf("events %v: EventLeaseLost there = %v, want %v", kinds, lost, !lost)
	}
}
