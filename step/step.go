// Package step runs the steps of a protected call once per key: a named
// part of the work (a charge, an email, a row in another database) whose
// result is recorded under the call's key, fenced by its lease, so that a
// later holder of the key (the retry after a crash, or after a released
// attempt) gets the recorded result instead of running the step again.
//
// A step runs inside any door's protected run: an HTTP handler behind
// server's middleware, a function under once.Do, a gRPC handler behind
// idemgrpc's interceptor, a webhook receiver. The store must keep steps
// (engine.StepStore: memstore, pgstore, redisstore, sqlitestore and
// mysqlstore do). A call that a door runs unprotected (its store failed,
// and engine.Config.FailOpen) has no steps: Run returns an error wrapping
// ErrNoSteps, and the step does not run.
//
//	order, err := step.Run(ctx, "charge", req.Amount, func(ctx context.Context) (Charge, error) {
//		return payments.Charge(ctx, req.Amount) // a client call derives its key from "charge"
//	})
//
// # What a run must know
//
//   - Names: each step of a run has its own name (a loop names its steps by
//     item: "email:"+addr). A name used twice in one run is refused, and
//     the step does not run, unless its first use failed (its function
//     returned an error): then the name may be tried again. A name whose
//     function panicked stays used.
//   - Inputs: a step's input is fingerprinted (encoded with the engine's
//     codec, engine.Config.Codec, then SHA-256). A recorded step whose
//     input differs is refused with an error wrapping
//     engine.ErrKeyMismatch, and does not run; so is an input that the
//     codec cannot encode (it fails, or panics).
//   - Results are encoded with the same codec (JSON by default) and must
//     round-trip through it (through the gRPC door a protobuf message needs
//     a codec that keeps it, such as one on protojson). A result larger
//     than 64 KiB, or one the codec cannot encode (it fails, or panics), or
//     one the store refuses for good (engine.ErrNotStorable: a store at its
//     bound), is recorded as done without its value: the run that ran it
//     gets the value, and later runs get engine.ErrResultOmitted. A
//     recorded result that the codec cannot decode is an error, and the
//     step does not run. A call records at most 100 steps.
//   - Errors: a step whose function returns an error is not recorded, and
//     runs again on the retry: return an error only when the effect did not
//     happen. A step that ran but whose result the store did not take
//     returns its value with an error wrapping engine.ErrStoreUnavailable:
//     pass it on (an HTTP 5xx, an error from once.Do's function), so that
//     the key is released and the retry resumes.
//   - Panics: a function that panics is a step whose holder was lost
//     while it ran (it may have had its effect): the panic goes on, the
//     door releases the key, and the retry runs the step again under the
//     default policy, or is told that its outcome is unknown under
//     engine.RefuseAbandoned, whose start the step recorded.
//   - Goroutines: a run may run its steps on several goroutines, and a step
//     may run others inside its function; each is a step of the call under
//     its own name. A step begun once the work has ended (its lease lost,
//     or the work returned) returns an error and does not run, even on a
//     context detached from the work's (context.WithoutCancel): a goroutine
//     that outlives the work has no lease to record a step under. A work
//     that goes on when its caller has gone, on a context detached from the
//     caller's, still runs and records its steps. Put http.TimeoutHandler
//     around server's middleware, not inside it: inside, its answer
//     releases the key while a step may still run, whose result is then
//     refused (an error wrapping engine.ErrLeaseLost) and which runs again
//     on the retry.
//   - Transactional mode (pgstore.WithTransactions): a step is recorded
//     in the call's own transaction, and commits with the call's response
//     or is rolled back with the call. A call released (a 5xx, an error)
//     or lost (its process died) keeps no step, and its retry runs every
//     step again: steps resume a call only in lease mode, where an effect
//     outside the database is what they protect. The steps' records are
//     written one at a time on the transaction's connection; the work's
//     own statements in it, and pgstore.RunStep, must not run while a
//     step is recorded.
//   - Downstream keys: inside a step, the client (package idempotency)
//     derives the keys of downstream requests from the step's name, so the
//     request a resumed step sends is the one its first run sent.
//   - Abandoned: under the default policy (engine.RerunAbandoned) a step
//     that a lost holder finished is replayed, but one it was running when
//     it was lost runs again, and cannot tell: engine.LeaseFromContext
//     reports Abandoned > 0 to the whole run. Under engine.RefuseAbandoned,
//     each step records its start before it runs (one more store round
//     trip per step: two in all), a takeover of a call whose holder
//     recorded steps resumes it instead of refusing it, its finished steps
//     are replayed, and a step started by a lost holder and never finished
//     returns an error wrapping engine.ErrOutcomeUnknown without running:
//     the work decides (look for the effect, or answer "unknown"). A lost
//     holder that recorded no step leaves the whole call "outcome
//     unknown", as without steps: keep every effect of such a call inside
//     a step. A step whose start the store did not take does not run, and
//     its start is taken back (one more store call, within the store
//     timeout): the store may have recorded it all the same, and the retry
//     must not be told that a step that never ran has an unknown outcome.
//     A change of policy between deploys: a start recorded under
//     RefuseAbandoned, read under the default policy, is a step that was
//     running when its holder was lost, and runs again; a holder lost
//     under the default policy recorded no start, so a takeover under
//     RefuseAbandoned resumes the call and runs the step it was running
//     again (Abandoned > 0 says so).
//
// A completed call's response replaces its steps (the store drops them); a
// released one keeps them for the retry, whatever its fingerprint: the key
// is then refused to another request (engine.ErrKeyMismatch) until it
// expires.
//
// # Cost
//
// A step costs one store round trip on its first run (two under
// engine.RefuseAbandoned) and none when replayed; a call that records no
// step costs nothing more: a Claim returns the recorded steps with the
// lease. pgstore.RunStep runs a step whose PostgreSQL writes commit in
// one transaction with its record: exactly once, even when the process
// dies in the middle.
package step

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/derive"
	"github.com/idemkit/idempotency/internal/steps"
)

// ErrNoSteps is wrapped by what Run returns when ctx belongs to no
// protected call (a door's run), or its store keeps no steps
// (engine.StepStore). A call that a door runs unprotected
// (engine.Config.FailOpen) gets it too.
var ErrNoSteps = steps.ErrNoSteps

// Run runs fn once for the call that ctx belongs to, under the name name,
// and returns its value, or the value recorded when an earlier holder of
// the call's key ran it. The package documentation says what every outcome
// returns. fn gets ctx, naming the step for the client's derived keys.
func Run[T any](ctx context.Context, name string, input any, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	j, err := steps.FromContext(ctx)
	if err != nil {
		return zero, fmt.Errorf("step %q: %w", name, err)
	}
	if fn == nil {
		return zero, fmt.Errorf("step %q: Run needs a function", name)
	}
	fp, prior, err := j.Begin(name, input)
	if err != nil {
		return zero, err
	}
	if prior != nil {
		switch {
		case prior.Done:
			var v T
			if err := j.Decode(name, prior.Result, &v); err != nil {
				return zero, err
			}
			return v, nil
		case j.AtMostOnce:
			return zero, fmt.Errorf("step %q: started by a holder that was lost before it finished: %w", name, engine.ErrOutcomeUnknown)
		}
		// A start recorded under RefuseAbandoned, run now under the
		// default policy: run it again.
	}
	err = context.Cause(ctx)
	if err == nil {
		// A goroutine that outlives the work may run a step on a context
		// detached from the work's: its result could be recorded under
		// no lease, and a retry would run it again.
		err = j.Saver.Ended()
	}
	if err != nil {
		j.Forget(name)
		return zero, fmt.Errorf("step %q: not run: %w", name, err)
	}
	if j.AtMostOnce {
		if err := j.Saver.SaveStep(ctx, steps.Entry{Name: name, Fingerprint: fp}); err != nil {
			j.Forget(name)
			return zero, fmt.Errorf("step %q: its start was not recorded, so it did not run: %w", name, err)
		}
	}
	v, err := fn(derive.WithStep(ctx, name))
	if err != nil {
		if j.AtMostOnce {
			// The function says nothing happened: take the start back,
			// so that the retry runs the step again. If that fails the
			// start stays, and the retry is told "outcome unknown". The
			// name is given back only then: a use of it let in sooner
			// would record its own start, which this removal would
			// erase.
			if serr := j.Saver.SaveStep(ctx, steps.Entry{Name: name}); serr != nil {
				j.Forget(name)
				return v, errors.Join(err, fmt.Errorf("step %q: its start could not be taken back: %w", name, serr))
			}
		}
		j.Forget(name)
		return v, err
	}
	result := j.Encode(name, fp, v)
	err = j.Saver.SaveStep(ctx, steps.Entry{Name: name, Fingerprint: fp, Done: true, Result: result})
	if errors.Is(err, engine.ErrNotStorable) && !steps.IsOmitted(result) {
		// The store will never take this result (a store at its bound,
		// say): record the step as done without it, as a result too
		// large for a step is, so that it does not run again.
		err = j.Saver.SaveStep(ctx, steps.Entry{Name: name, Fingerprint: fp, Done: true, Result: steps.Omitted()})
	}
	if err != nil {
		return v, fmt.Errorf("step %q: ran, but its result was not recorded: %w", name, err)
	}
	return v, nil
}
