package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	stepLimits "github.com/idemkit/idempotency/internal/steps"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// maxPacketSlack is the room that a record's log of steps leaves under the
// server's max_allowed_packet: for the rest of the statement that rewrites
// it, and for the rest of its row, which a Claim and a Lookup read (the
// fingerprint, up to 64 KiB, and a few numbers), should a server cap what
// it sends as it caps what it takes (MariaDB 10.11 does not).
const maxPacketSlack = 256 << 10

// errPacketTooSmall is why a step is refused when the log would pass the
// server's max_allowed_packet.
var errPacketTooSmall = errors.New("the record's steps would pass the server's max_allowed_packet")

// SaveStep implements engine.StepStore. A step is one statement
// (stepAppendSQL), one round trip: it appends the step's entry to the
// record's log, conditional on the token. When that changes nothing (the
// lease was lost; the log has stepLimits.MaxSteps entries, or would pass the
// server's max_allowed_packet), and for the removal of a step, it rewrites
// the log compacted in a short transaction: BEGIN, SELECT … FOR UPDATE,
// UPDATE, COMMIT. MySQL has no function that reads the log, so that a
// statement cannot both decide from it and change it.
//
// In transactional mode the step is written in the lease's transaction,
// the one the handler has from TxFromContext, which holds the record's row
// lock (any other connection would wait for it): it commits with the
// response, or rolls back with the handler's writes.
func (s *store) SaveStep(ctx context.Context, id engine.ID, token engine.Token, step engine.Step) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mysqlstore: save step: %w", err)
	}
	if err := sqlrecord.CheckStep(step); err != nil {
		return fmt.Errorf("mysqlstore: save step: %w", err)
	}
	var (
		tx                 *sql.Tx
		appendSQL, readSQL = s.q.stepAppend, s.q.stepRead
	)
	if s.transactional {
		o := s.txs.Get(id, token)
		if o == nil {
			return fmt.Errorf("mysqlstore: save step: %w", s.lost())
		}
		o.Steps.Lock()
		defer o.Steps.Unlock()
		tx, appendSQL, readSQL = o.Tx, s.q.stepAppendTx, s.q.stepReadTx
	}
	held := []any{[]byte(id.Scope), []byte(id.Key), int64(token)}
	if step.Fingerprint != "" {
		entry := sqlrecord.AppendStep(nil, step)
		n, err := s.exec(ctx, tx, appendSQL, append(append([]any{entry}, held...), stepLimits.MaxSteps, len(entry), maxPacketSlack)...)
		if err != nil {
			return s.stepError(err)
		}
		if n > 0 {
			return nil
		}
	}
	if tx != nil {
		return s.stepError(s.rewriteSteps(ctx, tx, readSQL, held, step))
	}
	if err := s.p.ready(ctx, readSQL, s.q.stepWrite); err != nil {
		return s.stepError(err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.stepError(err)
	}
	defer tx.Rollback()
	if err := s.rewriteSteps(ctx, tx, readSQL, held, step); err != nil {
		return s.stepError(err)
	}
	return s.stepError(tx.Commit())
}

// rewriteSteps records step by rewriting the record's log compacted, in tx:
// it reads and locks the log of the record held (readSQL, with held), and
// rewrites it.
func (s *store) rewriteSteps(ctx context.Context, tx *sql.Tx, readSQL string, held []any, step engine.Step) error {
	var (
		log       []byte
		maxPacket int64
	)
	err := s.p.queryRow(ctx, tx, func(r *sql.Row) error { return r.Scan(&log, &maxPacket) }, readSQL, held...)
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
	log = sqlrecord.EncodeSteps(steps)
	if int64(len(log)) > maxPacket-maxPacketSlack {
		return fmt.Errorf("step %q: %w (%d bytes, %d less %d): %w", step.Name, errPacketTooSmall, len(log), maxPacket, maxPacketSlack, engine.ErrNotStorable)
	}
	n, err := s.exec(ctx, tx, s.q.stepWrite, append([]any{log, len(steps)}, held...)...)
	if err == nil && n == 0 {
		err = engine.ErrLeaseLost // the row the read locked: never
	}
	return err
}

// stepError wraps the error of SaveStep; nil stays nil.
func (s *store) stepError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrTxDone):
		// Complete, Release or Close ended the lease's transaction.
		return fmt.Errorf("mysqlstore: save step: %w: %w", s.lost(), err)
	case errors.Is(err, engine.ErrLeaseLost), errors.Is(err, engine.ErrNotStorable):
		return fmt.Errorf("mysqlstore: save step: %w", err)
	case isNotStorable(err):
		return fmt.Errorf("mysqlstore: save step: %w: %w", engine.ErrNotStorable, err)
	}
	return fmt.Errorf("mysqlstore: save step: %w", err)
}

// migrateSteps adds to a table made before steps the columns they need. An
// instance that finds a column missing adds it; when another instance added
// it meanwhile, the server refuses the second ALTER (duplicate column),
// which is the answer sought.
func (s *store) migrateSteps(ctx context.Context) error {
	for i, c := range stepColumns {
		_, err := s.db.ExecContext(ctx, s.q.stepProbe[i])
		if !isErr(err, errBadField) {
			if err != nil {
				return err
			}
			continue
		}
		if _, err := s.db.ExecContext(ctx, s.q.stepAdd[i]); err != nil && !isErr(err, errDupFieldName) {
			return fmt.Errorf("adding column %s: %w", c[0], err)
		}
	}
	return nil
}
