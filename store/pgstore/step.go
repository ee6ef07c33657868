package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/derive"
	"github.com/idemkit/idempotency/internal/steps"
)

// errStepTx is what Commit and Rollback of the transaction that RunStep
// hands its function return.
var errStepTx = errors.New("pgstore: the step's transaction belongs to RunStep: it commits it with the step's record, or rolls it back")

// stepTx is the transaction of a step: the step's function writes in it,
// RunStep ends it.
type stepTx struct{ pgx.Tx }

func (stepTx) Commit(context.Context) error   { return errStepTx }
func (stepTx) Rollback(context.Context) error { return errStepTx }

// RunStep runs fn once for the call that ctx belongs to, as package step's
// Run does, but in a transaction of s's pool whose commit records the step
// too: fn writes in tx, and its writes and the step's record commit
// together, or neither does. A step whose effects are rows of s's database
// is so run exactly once per key, even when the process dies in the middle
// of it: a retry of the call (after a takeover, or after a release) gets
// the recorded result and fn does not run again, or finds no record and
// none of fn's writes, and runs fn.
//
// ctx must belong to a call that a door protects with s (an HTTP handler
// behind server's middleware, a function under once.Do): its lease's token
// fences the step's record. The step is named name, its input fingerprinted
// and its result encoded with the engine's codec, and names, inputs and
// recorded results behave as package step documents: a name used twice in
// a run is refused, an input that differs from the
// recorded one too (engine.ErrKeyMismatch), and neither runs fn; a step recorded
// as done returns its recorded value without running fn; one that a lost
// holder started with package step under engine.RefuseAbandoned and never
// finished returns an error wrapping engine.ErrOutcomeUnknown; a context
// already done runs nothing. fn gets ctx, naming the step for the client's
// derived keys, and tx, which it must not commit or roll back (both fail).
//
// In lease mode the step is its own transaction, READ COMMITTED, on a
// connection of the pool: BEGIN, fn's statements, the UPDATE that records
// the step (the statement of SaveStep: fenced by the lease's token, last,
// so that the record's row is locked only from then to the COMMIT), and
// COMMIT; three round trips besides fn's. No start is recorded, even under
// engine.RefuseAbandoned: the transaction leaves nothing half done for a
// retry to wonder about.
//
// Every failure leaves the step not done, and the call may be retried:
//   - fn returns an error: the transaction is rolled back, and RunStep
//     returns fn's value and error; the name may be used again in the run.
//   - the lease was lost before the step's record was written (the call
//     was taken over, or settled): the transaction, fn's writes with it,
//     is rolled back, and the error wraps engine.ErrLeaseLost.
//   - the database fails, before COMMIT or when it refuses it: everything
//     is rolled back, and the error wraps engine.ErrStoreUnavailable. When
//     the answer to COMMIT itself is lost (the connection broke) the
//     error wraps engine.ErrStoreUnavailable too, and whether the step
//     committed is unknown to this run only: pass the error on (a 5xx, an
//     error from once.Do's function) and the retry of the call finds the
//     step done, with its writes, or not at all.
//
// In transactional mode (WithTransactions) the whole call is already one
// transaction: RunStep runs fn in a savepoint of it and records the step
// there, and everything commits with the response, or is rolled back with
// the call. fn's error rolls back to the savepoint. The call's steps then
// share its transaction's connection, as the handler's statements do: run
// them one at a time.
func RunStep[T any](ctx context.Context, st Store, name string, input any, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	j, err := steps.FromContext(ctx)
	if err != nil {
		return zero, fmt.Errorf("pgstore: step %q: %w", name, err)
	}
	lease, ok := engine.LeaseFromContext(ctx)
	if !ok {
		return zero, fmt.Errorf("pgstore: step %q: %w", name, steps.ErrNoSteps)
	}
	s, ok := st.(*store)
	if !ok || s == nil || fn == nil {
		return zero, fmt.Errorf("pgstore: step %q: RunStep needs a Store made by New and a function", name)
	}
	fp, prior, err := j.Begin(name, input)
	if err != nil {
		return zero, fmt.Errorf("pgstore: %w", err)
	}
	if prior != nil {
		switch {
		case prior.Done:
			var v T
			if err := j.Decode(name, prior.Result, &v); err != nil {
				return zero, fmt.Errorf("pgstore: %w", err)
			}
			return v, nil
		case j.AtMostOnce:
			return zero, fmt.Errorf("pgstore: step %q: started by a holder that was lost before it finished: %w", name, engine.ErrOutcomeUnknown)
		}
		// A start recorded by package step under RefuseAbandoned, run
		// now under the default policy: run it again.
	}
	if err := context.Cause(ctx); err != nil {
		j.Forget(name)
		return zero, fmt.Errorf("pgstore: step %q: not run: %w", name, err)
	}
	r := stepRun[T]{s: s, j: j, lease: lease, name: name, fp: fp, fn: fn}
	if s.transactional {
		return r.inCall(ctx)
	}
	return r.alone(ctx)
}

// stepRun is one run of RunStep's function, once the journal said to run it.
type stepRun[T any] struct {
	s     *store
	j     *steps.Journal
	lease engine.Lease
	name  string
	fp    string
	fn    func(context.Context, pgx.Tx) (T, error)
}

// alone runs the step in a transaction of its own (lease mode).
func (r *stepRun[T]) alone(ctx context.Context) (T, error) {
	var (
		zero T
		tx   pgx.Tx
	)
	s := r.s
	err := s.retry(ctx, func() (err error) {
		tx, err = s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		return err
	})
	if err != nil {
		r.j.Forget(r.name)
		return zero, r.fail("not run", errors.Join(engine.ErrStoreUnavailable, err))
	}
	committed := false
	defer func() {
		if !committed {
			// fn's writes go, on every path, a panic's included.
			rollback(ctx, tx)
		}
	}()
	v, err := r.fn(derive.WithStep(ctx, r.name), stepTx{tx})
	if err != nil {
		r.j.Forget(r.name)
		return v, err
	}
	if err := r.record(ctx, tx, false, s.hotMode(), v); err != nil {
		s.notePrepared(err)
		return zero, err
	}
	// The record's row is locked from the UPDATE on, which fences the step
	// until the COMMIT: nobody can take the call over meanwhile. So the
	// COMMIT is sent even if ctx has ended since (the lease's known end
	// passed, say), within the cleanup timeout.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err = tx.Commit(cctx)
	committed = true
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.Is(err, pgx.ErrTxCommitRollback) || errors.As(err, &pgErr) {
			r.j.Forget(r.name)
			return zero, r.fail("rolled back at commit", errors.Join(engine.ErrStoreUnavailable, err))
		}
		return zero, r.fail("commit not confirmed: whether the step happened is unknown until the call's retry",
			errors.Join(engine.ErrStoreUnavailable, err))
	}
	return v, nil
}

// inCall runs the step in a savepoint of the call's transaction
// (transactional mode).
func (r *stepRun[T]) inCall(ctx context.Context) (T, error) {
	var zero T
	s := r.s
	tx, err := s.leaseTx(r.lease.ID, r.lease.Token)
	if err != nil {
		r.j.Forget(r.name)
		return zero, r.fail("not run", err)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		r.j.Forget(r.name)
		return zero, r.fail("not run", errors.Join(engine.ErrStoreUnavailable, err))
	}
	released := false
	defer func() {
		if !released {
			// Back to the savepoint: the call's transaction goes on
			// without fn's writes.
			rollback(ctx, sp)
		}
	}()
	v, err := r.fn(derive.WithStep(ctx, r.name), stepTx{sp})
	if err != nil {
		r.j.Forget(r.name)
		return v, err
	}
	if err := r.record(ctx, sp, true, s.coldMode, v); err != nil {
		return zero, err
	}
	err = sp.Commit(ctx)
	released = true
	if err != nil {
		// The call's transaction is broken: its Complete fails, and the
		// call is retried without the step.
		r.j.Forget(r.name)
		return zero, r.fail("not recorded", errors.Join(engine.ErrStoreUnavailable, err))
	}
	return v, nil
}

// record writes the step's record, with v as its result, in tx, whose
// transaction the caller rolls back on an error.
func (r *stepRun[T]) record(ctx context.Context, tx pgx.Tx, transactional bool, mode pgx.QueryExecMode, v T) error {
	st := engine.Step{Name: r.name, Fingerprint: r.fp, Done: true, Result: r.j.Encode(r.name, r.fp, v)}
	prefix, elem, err := stepArgs(st)
	var verdict int32
	if err == nil {
		verdict, err = r.s.writeStep(ctx, tx, transactional, mode, r.lease.ID, r.lease.Token, prefix, elem)
		if err != nil {
			err = errors.Join(engine.ErrStoreUnavailable, err)
		} else {
			err = stepResult(verdict)
		}
	}
	if err != nil {
		r.j.Forget(r.name)
		return r.fail("rolled back, its record not written", err)
	}
	return nil
}

// fail returns RunStep's error for the step.
func (r *stepRun[T]) fail(what string, err error) error {
	return fmt.Errorf("pgstore: step %q: %s: %w", r.name, what, err)
}
