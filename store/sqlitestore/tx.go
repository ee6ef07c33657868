package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// errRolledBack is wrapped by Complete in transactional mode when
// the lease's transaction could not commit and was rolled back: the
// handler's writes and the claim are undone, and the request may run again.
var errRolledBack = errors.New("transaction rolled back")

type txContextKey struct{}

// TxFromContext returns the transaction of the lease that the handler runs
// under, in transactional mode: the handler writes its effects in it, and
// they commit with the stored response, or roll back with the claim. The
// transaction belongs to the Store: do not Commit or Roll it back. ok is
// false outside such a handler.
func TxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	tx, ok = ctx.Value(txContextKey{}).(*sql.Tx)
	return tx, ok
}

// Bind returns ctx with the lease's transaction, in transactional mode, for
// TxFromContext; in lease mode it returns ctx.
func (s *store) Bind(ctx context.Context, id engine.ID, token engine.Token) context.Context {
	ctx, _ = s.txs.Bind(ctx, id, token, txContextKey{})
	return ctx
}

// claimTx claims in a transaction that, when the claim is Acquired, stays
// open with this process's turn to write until Complete or Release.
func (s *store) claimTx(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (c engine.Claim, ok bool, err error) {
	if err := s.lock(ctx); err != nil {
		return engine.Claim{}, false, err
	}
	kept := false
	defer func() {
		if !kept {
			s.unlock()
		}
	}()
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the file's write lock
	if err != nil {
		return engine.Claim{}, false, err
	}
	c, ok, err = s.take(ctx, tx.StmtContext(ctx, s.st.claim), id, fingerprint, lease, ttl)
	if err != nil || !ok {
		tx.Rollback()
		return c, ok, err
	}
	o := &sqlrecord.OpenTx{Tx: tx, End: s.unlock}
	if !s.txs.Put(id, c.Token, o) {
		tx.Rollback()
		return engine.Claim{}, false, engine.ErrStoreClosed
	}
	kept = true
	return c, true, nil
}

// completeTx stores the response in the lease's transaction and commits it.
// Every error wraps engine.ErrNotCommitted.
func (s *store) completeTx(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, headers []byte, ttl time.Duration) error {
	o := s.txs.Take(id, token)
	if o == nil && s.closed.Load() {
		return fmt.Errorf("sqlitestore: complete: %w: %w", engine.ErrNotCommitted, engine.ErrStoreClosed)
	}
	if o == nil {
		return fmt.Errorf("sqlitestore: complete: %w: %w", engine.ErrNotCommitted, engine.ErrLeaseLost)
	}
	defer o.Done(errRolledBack)
	// The store's context ends with the store timeout; the transaction
	// must end either way, committed or rolled back.
	now := s.now()
	ctx = context.WithoutCancel(ctx)
	r, err := o.Tx.StmtContext(ctx, s.st.completeTx).ExecContext(ctx, int64(token), []byte(id.Scope), []byte(id.Key), now,
		now+sqlrecord.Micros(ttl), resp.Status, headers, body(resp), resp.BodyOmitted)
	var n int64
	if err == nil {
		n, err = r.RowsAffected()
	}
	if err == nil && n == 0 {
		err = engine.ErrLeaseLost
	}
	if err != nil {
		o.Tx.Rollback()
		return fmt.Errorf("sqlitestore: complete: %w: %w: %w", engine.ErrNotCommitted, errRolledBack, err)
	}
	if err := o.Tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: complete: commit: %w: %w", engine.ErrNotCommitted, err)
	}
	return nil
}

// releaseTx rolls the lease's transaction back.
func (s *store) releaseTx(id engine.ID, token engine.Token) error {
	o := s.txs.Take(id, token)
	if o == nil && s.closed.Load() {
		return fmt.Errorf("sqlitestore: release: %w", engine.ErrStoreClosed)
	}
	if o == nil {
		return fmt.Errorf("sqlitestore: release: %w", engine.ErrLeaseLost)
	}
	defer o.Done(errRolledBack)
	if err := o.Tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("sqlitestore: release: %w", err)
	}
	return nil
}

// abortTx ends the lease's transaction of a Complete or Release whose
// context was done before it began: it rolls the transaction back, so that
// the file's write lock is not kept for a call that will not come, and
// fails with cause (and, for a Complete, engine.ErrNotCommitted).
func (s *store) abortTx(op string, id engine.ID, token engine.Token, cause error) error {
	o := s.txs.Take(id, token)
	if o == nil {
		if op == "complete" {
			return fmt.Errorf("sqlitestore: %s: %w: %w: %w", op, engine.ErrNotCommitted, engine.ErrLeaseLost, cause)
		}
		return fmt.Errorf("sqlitestore: %s: %w: %w", op, engine.ErrLeaseLost, cause)
	}
	defer o.Done(errRolledBack)
	o.Tx.Rollback()
	if op == "complete" {
		return fmt.Errorf("sqlitestore: %s: %w: %w: %w", op, engine.ErrNotCommitted, errRolledBack, cause)
	}
	return fmt.Errorf("sqlitestore: %s: rolled back: %w", op, cause)
}
