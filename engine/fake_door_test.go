package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

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
