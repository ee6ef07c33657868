package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// ErrRolledBack is returned, wrapped, by Complete in transactional mode when
// the lease's transaction could not commit and was rolled back: the
// handler's writes and the claim are undone, and the request may run again.
var ErrRolledBack = errors.New("transaction rolled back")

// notCommitted marks an error of Complete in transactional mode: the
// handler's writes were not committed, or may not have been.
type notCommitted struct{ err error }

func (e notCommitted) Error() string   { return e.err.Error() }
func (e notCommitted) Unwrap() []error { return []error{e.err, engine.ErrNotCommitted} }

// errOwnedTx is returned by Commit and Rollback of the transaction that
// TxFromContext hands out.
var errOwnedTx = errors.New("pgstore: the transaction belongs to the store: Complete commits it, Release rolls it back")

// txKey addresses an open transaction: the lease it is.
type txKey struct {
	id    engine.ID
	token engine.Token
}

// openTx is a transaction of transactional mode, from the Claim that began
// it to the Complete, Release or Close that ends it. Its fields but tx and
// backend are guarded by Store.mu while it is in Store.txs; the one who
// takes it out owns it.
type openTx struct {
	tx      pgx.Tx
	backend backend
	// ended records that the server ended the transaction (see
	// txwatch.go).
	ended bool
	// cancels cancel the contexts that Bind returned for it.
	cancels []context.CancelCauseFunc
}

// claimTx is Claim in transactional mode: it begins a transaction, claims
// in it and, when the claim is Acquired, keeps it open for Bind, Complete and
// Release.
func (s *store) claimTx(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: s.begin(ctx)})
	if err != nil {
		return engine.Claim{}, err
	}
	c, b, err := s.claim(ctx, tx, id, fingerprint, lease, ttl)
	if err != nil {
		rollback(ctx, tx)
		if isLockTimeout(err) {
			// Another transaction holds the key: it is in flight.
			return engine.Claim{Status: engine.InFlight, Fingerprint: fingerprint, RetryAfter: s.lockTimeout}, nil
		}
		return engine.Claim{}, err
	}
	if c.Status != engine.Acquired {
		// Nothing was written, so the answer stands even if the rollback
		// fails (and closes the connection).
		rollback(ctx, tx)
		return c, nil
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		rollback(ctx, tx)
		return engine.Claim{}, engine.ErrStoreClosed
	}
	s.txs[txKey{id, c.Token}] = &openTx{tx: tx, backend: b}
	if !s.watching {
		s.watching = true
		s.watchers.Add(1)
		go s.watch()
	}
	s.mu.Unlock()
	return c, nil
}

// begin returns the statement that begins a transaction of a Claim whose
// context is ctx. The Claim waits for a concurrent transaction that holds
// its key for at most the lock timeout, and for at most half the time ctx
// has left: a wait that ctx's deadline cut would be a store failure (503),
// where one that ends at the lock timeout is InFlight (409), and the other
// half leaves the Claim time to roll back and answer. (The middleware's
// Claim has less than the lease: a lease under the lock timeout would
// otherwise turn every duplicate into a failure.)
func (s *store) begin(ctx context.Context) string {
	deadline, ok := ctx.Deadline()
	if !ok {
		return s.beginSQL
	}
	if d := time.Until(deadline) / 2; d < s.lockTimeout {
		return beginSQL(d, s.idleTimeout)
	}
	return s.beginSQL
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// take removes the lease's transaction from the open ones and returns it, or
// nil. Whoever takes a transaction ends it, then calls done.
func (s *store) take(id engine.ID, token engine.Token) *openTx {
	k := txKey{id, token}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.txs[k]
	delete(s.txs, k)
	return o
}

// done cancels, with cause, the contexts that Bind returned for o, whose
// transaction has ended, so that none outlives it (nor stays registered
// with its parent).
func (o *openTx) done(cause error) {
	for _, cancel := range o.cancels {
		cancel(cause)
	}
	o.cancels = nil
}

func (s *store) completeTx(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	o := s.take(id, token)
	if o == nil {
		return fmt.Errorf("pgstore: complete: %w", engine.ErrLeaseLost)
	}
	defer o.done(nil)
	tx := o.tx
	headers := sqlrecord.EncodeHeader(resp.Header)
	if storable(id, resp, headers) != nil {
		// The handler's writes are in this transaction: keep them, and
		// record the request as done without the body (and, should they be
		// the trouble, without its headers), as the middleware would after
		// engine.ErrNotStorable in lease mode.
		resp = &engine.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}
		if headers = sqlrecord.EncodeHeader(resp.Header); storable(id, resp, headers) != nil {
			resp.Header, headers = nil, nil
		}
		if err := storable(id, resp, headers); err != nil {
			// A status no HTTP server sends; not engine.ErrNotStorable,
			// since what the handler wrote is rolled back.
			rollback(ctx, tx)
			return fmt.Errorf("pgstore: complete: %w: %v", ErrRolledBack, err)
		}
	}
	// Unnamed: a statement that fails here cannot run again without losing
	// the handler's writes, so it must not depend on a prepared statement
	// that a pooler in transaction mode may have lost (see retry).
	tag, err := tx.Exec(ctx, s.stmts().completeTx, s.coldMode, []byte(id.Scope), []byte(id.Key), int64(token),
		micros(ttl), int32(resp.Status), headers, resp.Body, resp.BodyOmitted)
	if err == nil && tag.RowsAffected() == 0 {
		// Not while the transaction holds the row.
		err = engine.ErrLeaseLost
	}
	if err != nil {
		rollback(ctx, tx)
		return fmt.Errorf("pgstore: complete: %w: %w", ErrRolledBack, err)
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return fmt.Errorf("pgstore: complete: %w", ErrRolledBack)
		}
		return fmt.Errorf("pgstore: complete: commit: %w", err)
	}
	return nil
}

func (s *store) releaseTx(ctx context.Context, id engine.ID, token engine.Token) error {
	o := s.take(id, token)
	if o == nil {
		return fmt.Errorf("pgstore: release: %w", engine.ErrLeaseLost)
	}
	// A rollback that fails closes the connection (pgx does), which rolls
	// the transaction back as surely: either way it is released.
	rollback(ctx, o.tx)
	o.done(nil)
	return nil
}

// extendTx is Extend in transactional mode: the lease holds while its
// transaction is open on the server, which it asks (see txwatch.go).
func (s *store) extendTx(ctx context.Context, id engine.ID, token engine.Token) error {
	k := txKey{id, token}
	s.mu.Lock()
	o := s.txs[k]
	var (
		b     backend
		ended bool
	)
	if o != nil {
		b, ended = o.backend, o.ended
	}
	s.mu.Unlock()
	if o == nil {
		return fmt.Errorf("pgstore: extend: %w", engine.ErrLeaseLost)
	}
	if ended {
		return fmt.Errorf("pgstore: extend: %w", errEndedByServer)
	}
	live, err := s.alive(ctx, []backend{b})
	if err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	if !live[0] {
		s.ended(k, o)
		return fmt.Errorf("pgstore: extend: %w", errEndedByServer)
	}
	return nil
}

// rollback ends tx even when ctx is done, within cleanupTimeout. A rollback
// that cannot run closes the connection, which PostgreSQL answers by rolling
// the transaction back.
func rollback(ctx context.Context, tx pgx.Tx) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// Bind implements engine.Binder. In transactional mode it returns a copy of
// ctx that carries the lease's transaction, for TxFromContext; otherwise, or
// when the lease holds no open transaction, it returns ctx.
//
// The copy is done once the transaction has ended: committed by Complete,
// rolled back by Release, or, while the handler may still run, rolled back
// by Close or ended by the server (its idle timeout, an operator, a broken
// connection), which releases the key to the next request; in those two
// cases context.Cause wraps engine.ErrLeaseLost. The Store looks whether
// the server ended it every quarter of the idle timeout (between 25 ms and a
// second), and in every Extend.
func (s *store) Bind(ctx context.Context, id engine.ID, token engine.Token) context.Context {
	if !s.transactional {
		return ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.txs[txKey{id, token}]
	if !ok {
		return ctx
	}
	bound, cancel := context.WithCancelCause(ctx)
	if o.ended {
		cancel(errTxEnded)
	} else {
		o.cancels = append(o.cancels, cancel)
	}
	return context.WithValue(bound, txContextKey{}, ownedTx{o.tx})
}

type txContextKey struct{}

// TxFromContext returns the transaction of the lease that the handler runs
// under, in transactional mode: the context must come from Bind (the
// middleware does that). The handler does its writes in it, with its own
// context, so that they commit with the stored response or not at all. It
// must not commit or roll back the transaction (both fail): Complete and
// Release do. Nested transactions (Begin, savepoints) are fine. Like any
// pgx.Tx it is not safe for concurrent use.
//
// The second result is false when ctx carries no transaction: the Store is in
// lease mode, or the lease was lost.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txContextKey{}).(ownedTx)
	return tx, ok
}

// ownedTx is a transaction that the Store owns: the handler may use it, but
// not end it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return errOwnedTx }
func (ownedTx) Rollback(context.Context) error { return errOwnedTx }
