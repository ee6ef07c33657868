package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	stepLimits "github.com/idemkit/idempotency/internal/steps"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// SaveStep implements engine.StepStore. A step is one statement
// (stepAppendSQL), in this process's turn to write: it appends the step's
// entry to the record's log, conditional on the token. When that changes
// nothing (the lease was lost, the log has stepLimits.MaxSteps entries), and
// for the removal of a step, it rewrites the log compacted in one short
// write transaction (BEGIN IMMEDIATE, a read, a write, COMMIT): SQLite has
// no function that reads the log, so that a statement cannot both decide
// from it and change it.
//
// In transactional mode the step is written in the lease's transaction,
// the one the handler has from TxFromContext, which holds the file's write
// lock (any other connection would wait for it): it commits with the
// response, or rolls back with the handler's writes.
func (s *store) SaveStep(ctx context.Context, id engine.ID, token engine.Token, step engine.Step) error {
	if err := s.begin(ctx, "save step"); err != nil {
		return err
	}
	if err := sqlrecord.CheckStep(step); err != nil {
		return fmt.Errorf("sqlitestore: save step: %w", err)
	}
	if s.transactional {
		return s.saveStepTx(ctx, id, token, step)
	}
	if step.Fingerprint != "" {
		n, err := s.exec(ctx, s.st.stepAppend, int64(token), []byte(id.Scope), []byte(id.Key),
			sqlrecord.AppendStep(nil, step), stepLimits.MaxSteps, s.now())
		if err != nil {
			return s.fail("save step", err)
		}
		if n > 0 {
			return nil
		}
	}
	if err := s.lock(ctx); err != nil {
		return s.fail("save step", err)
	}
	defer s.unlock()
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the file's write lock
	if err != nil {
		return s.fail("save step", err)
	}
	defer tx.Rollback()
	if err := s.rewriteSteps(ctx, tx.StmtContext(ctx, s.st.stepRead), tx.StmtContext(ctx, s.st.stepWrite),
		[]any{int64(token), []byte(id.Scope), []byte(id.Key), s.now()}, token, step); err != nil {
		return s.stepError(err)
	}
	if err := tx.Commit(); err != nil {
		return s.fail("save step", err)
	}
	return nil
}

// saveStepTx records the step in the lease's transaction. The statements
// run to their end whatever ctx: an interrupted statement would roll the
// handler's transaction back, while database/sql would go on using its
// connection as if the transaction were open.
func (s *store) saveStepTx(ctx context.Context, id engine.ID, token engine.Token, step engine.Step) error {
	o := s.txs.Get(id, token)
	if o == nil && s.closed.Load() {
		return fmt.Errorf("sqlitestore: save step: %w", engine.ErrStoreClosed)
	}
	if o == nil {
		return fmt.Errorf("sqlitestore: save step: %w", engine.ErrLeaseLost)
	}
	o.Steps.Lock()
	defer o.Steps.Unlock()
	ctx = context.WithoutCancel(ctx)
	err := errNotAppended
	if step.Fingerprint != "" {
		var r sql.Result
		r, err = o.Tx.StmtContext(ctx, s.st.stepAppendTx).ExecContext(ctx, int64(token), []byte(id.Scope), []byte(id.Key),
			sqlrecord.AppendStep(nil, step), stepLimits.MaxSteps)
		var n int64
		if err == nil {
			n, err = r.RowsAffected()
		}
		if err == nil && n == 0 {
			err = errNotAppended
		}
	}
	if errors.Is(err, errNotAppended) {
		err = s.rewriteSteps(ctx, o.Tx.StmtContext(ctx, s.st.stepReadTx), o.Tx.StmtContext(ctx, s.st.stepWrite),
			[]any{int64(token), []byte(id.Scope), []byte(id.Key)}, token, step)
	}
	if errors.Is(err, sql.ErrTxDone) {
		// Complete, Release or Close ended the transaction meanwhile.
		err = engine.ErrLeaseLost
		if s.closed.Load() {
			err = engine.ErrStoreClosed
		}
	}
	if err != nil {
		return s.stepError(err)
	}
	return nil
}

// errNotAppended is why the log is rewritten rather than appended to.
var errNotAppended = errors.New("step not appended")

// rewriteSteps records step by rewriting the record's log compacted, within
// a transaction: read reads the log of the record held (with args), write
// rewrites it.
func (s *store) rewriteSteps(ctx context.Context, read, write *sql.Stmt, args []any, token engine.Token, step engine.Step) error {
	var log []byte
	err := read.QueryRowContext(ctx, args...).Scan(&log)
	if errors.Is(err, sql.ErrNoRows) {
		return engine.ErrLeaseLost
	}
	if err != nil {
		return err
	}
	steps, err := sqlrecord.DecodeSteps(log)
	if err != nil {
		return err
	}
	steps, changed, err := sqlrecord.ApplyStep(steps, step)
	if err != nil || !changed {
		return err
	}
	_, err = write.ExecContext(ctx, int64(token), sqlrecord.EncodeSteps(steps), len(steps))
	return err
}

// stepError wraps the error of SaveStep.
func (s *store) stepError(err error) error {
	switch {
	case errors.Is(err, engine.ErrLeaseLost), errors.Is(err, engine.ErrNotStorable):
		return fmt.Errorf("sqlitestore: save step: %w", err)
	case isTooBig(err):
		return fmt.Errorf("sqlitestore: save step: %w: %w", engine.ErrNotStorable, err)
	}
	return s.fail("save step", err)
}

// migrate adds to a table made before steps the columns they need, once:
// the first process to see them missing adds them in a write transaction,
// and every other one, waiting for its lock, then finds them there.
func migrate(ctx context.Context, db *sql.DB) error {
	missing, err := missingColumns(ctx, db)
	if err != nil || len(missing) == 0 {
		return err
	}
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: one process at a time
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if missing, err = missingColumns(ctx, tx); err != nil {
		return err
	}
	for _, c := range missing {
		if _, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+c[0]+` `+c[1]); err != nil {
			return fmt.Errorf("adding column %s: %w", c[0], err)
		}
	}
	return tx.Commit()
}

// missingColumns returns those of stepColumns that the table lacks.
func missingColumns(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) ([][2]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT name FROM pragma_table_info('`+table+`')`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		have[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var missing [][2]string
	for _, c := range stepColumns {
		if !have[c[0]] {
			missing = append(missing, c)
		}
	}
	return missing, nil
}
