package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

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

// claimTx claims in a transaction (READ COMMITTED, so that a read after a
// wait sees what committed), on a connection whose lock wait it sets to
// lockWait for the transaction's life. A replay is answered by a read
// outside any transaction.
func (s *store) claimTx(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	v, err := s.read(ctx, nil, id)
	if err != nil {
		return engine.Claim{}, err
	}
	if c, d, err := sqlrecord.Decide(v.row, v.found, fingerprint, v.now); err != nil || d == sqlrecord.Answer {
		return c, err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return engine.Claim{}, err
	}
	end := func() {
		// The connection goes back to the application's pool as it came.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT"); err != nil {
			conn.Raw(func(any) error { return errBadConn })
		}
		conn.Close()
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION innodb_lock_wait_timeout = %d", int(lockWait/time.Second))); err != nil {
		conn.Raw(func(any) error { return errBadConn })
		conn.Close()
		return engine.Claim{}, err
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		end()
		return engine.Claim{}, err
	}
	c, err := s.claim(ctx, tx, id, fingerprint, lease, ttl)
	if err != nil || c.Status != engine.Acquired {
		tx.Rollback()
		end()
		if isErr(err, errLockWaitTimeout) || isErr(err, errDeadlock) {
			// Another transaction holds the key: it is in flight.
			return engine.Claim{Status: engine.InFlight, Fingerprint: fingerprint, RetryAfter: lockWait}, nil
		}
		return c, err
	}
	if !s.txs.Put(id, c.Token, &sqlrecord.OpenTx{Tx: tx, End: end}) {
		tx.Rollback()
		end()
		return engine.Claim{}, engine.ErrStoreClosed
	}
	return c, nil
}

// errBadConn makes database/sql discard a connection whose session could
// not be put back as it was.
var errBadConn = driver.ErrBadConn

// completeTx stores the response in the lease's transaction and commits it.
// Every error wraps engine.ErrNotCommitted.
func (s *store) completeTx(ctx context.Context, id engine.ID, token engine.Token, args []any) error {
	o := s.txs.Take(id, token)
	if o == nil {
		return fmt.Errorf("mysqlstore: complete: %w: %w", engine.ErrNotCommitted, s.lost())
	}
	defer o.Done(errRolledBack)
	// The transaction must end, committed or rolled back, whatever the
	// store's context.
	ctx = context.WithoutCancel(ctx)
	n, err := s.exec(ctx, o.Tx, s.q.completeTx, args...)
	if err == nil && n == 0 {
		err = engine.ErrLeaseLost
	}
	if err != nil {
		o.Tx.Rollback()
		if isNotStorable(err) {
			err = fmt.Errorf("%w: %w", engine.ErrNotStorable, err)
		}
		return fmt.Errorf("mysqlstore: complete: %w: %w: %w", engine.ErrNotCommitted, errRolledBack, err)
	}
	if err := o.Tx.Commit(); err != nil {
		return fmt.Errorf("mysqlstore: complete: commit: %w: %w", engine.ErrNotCommitted, err)
	}
	return nil
}

// releaseTx rolls the lease's transaction back.
func (s *store) releaseTx(id engine.ID, token engine.Token) error {
	o := s.txs.Take(id, token)
	if o == nil {
		return fmt.Errorf("mysqlstore: release: %w", s.lost())
	}
	defer o.Done(errRolledBack)
	if err := o.Tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("mysqlstore: release: %w", err)
	}
	return nil
}

// lost is why a lease has no open transaction: Close rolled it back
// (engine.ErrStoreClosed), or it ended, or was never this Store's
// (engine.ErrLeaseLost).
func (s *store) lost() error {
	if s.closed.Load() {
		return engine.ErrStoreClosed
	}
	return engine.ErrLeaseLost
}

// abortTx ends the lease's transaction of a Complete or Release whose
// context was done before it began: it rolls the transaction back, so that
// neither the key's row lock nor the connection is kept for a call that may
// never come, and fails with cause (and, for a Complete,
// engine.ErrNotCommitted).
func (s *store) abortTx(op string, id engine.ID, token engine.Token, cause error) error {
	o := s.txs.Take(id, token)
	if o == nil {
		if op == "complete" {
			return fmt.Errorf("mysqlstore: %s: %w: %w: %w", op, engine.ErrNotCommitted, s.lost(), cause)
		}
		return fmt.Errorf("mysqlstore: %s: %w: %w", op, s.lost(), cause)
	}
	defer o.Done(errRolledBack)
	o.Tx.Rollback()
	if op == "complete" {
		return fmt.Errorf("mysqlstore: %s: %w: %w: %w", op, engine.ErrNotCommitted, errRolledBack, cause)
	}
	return fmt.Errorf("mysqlstore: %s: rolled back: %w", op, cause)
}
