package pgstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/steps"
)

// SaveStep implements engine.StepStore: one statement, and one round trip,
// which merges the step into the record's steps, fenced by the token (see
// the package documentation, Steps). A step over steps.MaxSize bytes,
// or one more than steps.MaxSteps, is refused with an error wrapping
// engine.ErrNotStorable, and so is a name that is empty or over 255 bytes.
//
// In transactional mode it writes in the lease's transaction, the one that
// Bind put in the handler's context (the transaction holds the record's
// row, which any other connection would wait for): the step commits with
// the handler's writes and the response, or is rolled back with them. Its
// statement is sent unnamed, as Complete's is in that mode (see README.md,
// Poolers), and, as any of the transaction's statements, must not run
// concurrently with another of them.
func (s *store) SaveStep(ctx context.Context, id engine.ID, token engine.Token, step engine.Step) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: save step: %w", err)
	}
	prefix, elem, err := stepArgs(step)
	if err != nil {
		return fmt.Errorf("pgstore: save step: %w", err)
	}
	var verdict int32
	if s.transactional {
		tx, err := s.leaseTx(id, token)
		if err == nil {
			verdict, err = s.writeStep(ctx, tx, true, s.coldMode, id, token, prefix, elem)
		}
		if err != nil {
			return fmt.Errorf("pgstore: save step: %w", err)
		}
	} else {
		err = s.retry(ctx, func() (err error) {
			verdict, err = s.writeStep(ctx, s.pool, false, s.hotMode(), id, token, prefix, elem)
			return err
		})
		if err != nil {
			return fmt.Errorf("pgstore: save step: %w", err)
		}
	}
	if err := stepResult(verdict); err != nil {
		return fmt.Errorf("pgstore: save step: %w", err)
	}
	return nil
}

// writeStep runs the statement that records a step (saveStepSQL) on db,
// in the version of transactional mode if tx, and returns its answer.
func (s *store) writeStep(ctx context.Context, db querier, tx bool, mode pgx.QueryExecMode, id engine.ID, token engine.Token, prefix, elem []byte) (int32, error) {
	sql := s.stmts().saveStep
	if tx {
		sql = s.stmts().saveStepTx
	}
	var verdict int32
	err := db.QueryRow(ctx, sql, mode, []byte(id.Scope), []byte(id.Key), int64(token), prefix, elem).Scan(&verdict)
	return verdict, err
}

// leaseTx returns the open transaction of a lease of transactional mode, or
// an error wrapping engine.ErrLeaseLost when it has ended.
func (s *store) leaseTx(id engine.ID, token engine.Token) (pgx.Tx, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.txs[txKey{id, token}]
	switch {
	case o == nil:
		return nil, engine.ErrLeaseLost
	case o.ended:
		return nil, errEndedByServer
	}
	return o.tx, nil
}

// A record's steps are the elements of its steps column (bytea[], NULL when
// there are none), one element per step, in an encoding of the package's
// own, so that every byte of a result is kept and a statement can find a
// step by its name without decoding the rest:
//
//	name length  1 byte, 1 to 255
//	name
//	flags        1 byte: 1 when the step is done
//	fp length    4 bytes, big-endian
//	fingerprint
//	result       the rest
//
// The name's length and the name begin the element (stepPrefix): an
// element is the step of a name exactly when it begins with that name's
// prefix, since the first byte tells the names' lengths apart.

// stepDone is the flag of a done step.
const stepDone = 1

// stepHeader is the bytes an element takes besides its name, fingerprint
// and result.
const stepHeader = 1 + 1 + 4

// stepPrefix returns the bytes that the elements of the step name begin
// with.
func stepPrefix(name string) []byte {
	b := make([]byte, 0, 1+len(name))
	b = append(b, byte(len(name)))
	return append(b, name...)
}

// encodeStep returns st's element. Its name must be 1 to 255 bytes long.
func encodeStep(st engine.Step) []byte {
	b := make([]byte, 0, stepHeader+len(st.Name)+len(st.Fingerprint)+len(st.Result))
	b = append(b, byte(len(st.Name)))
	b = append(b, st.Name...)
	var flags byte
	if st.Done {
		flags = stepDone
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, uint32(len(st.Fingerprint)))
	b = append(b, st.Fingerprint...)
	return append(b, st.Result...)
}

// decodeSteps decodes the elements of a steps column; nil for none.
func decodeSteps(els [][]byte) ([]engine.Step, error) {
	if len(els) == 0 {
		return nil, nil
	}
	out := make([]engine.Step, len(els))
	for i, e := range els {
		st, err := decodeStep(e)
		if err != nil {
			return nil, err
		}
		out[i] = st
	}
	return out, nil
}

var errStepCorrupt = errors.New("step record is corrupt")

func decodeStep(e []byte) (engine.Step, error) {
	if len(e) < 1 {
		return engine.Step{}, errStepCorrupt
	}
	n := int(e[0])
	if n == 0 || len(e) < 1+n+1+4 {
		return engine.Step{}, errStepCorrupt
	}
	st := engine.Step{Name: string(e[1 : 1+n])}
	e = e[1+n:]
	if e[0]&^stepDone != 0 {
		return engine.Step{}, errStepCorrupt
	}
	st.Done = e[0] == stepDone
	fp := binary.BigEndian.Uint32(e[1:5])
	e = e[5:]
	if uint64(fp) > uint64(len(e)) {
		return engine.Step{}, errStepCorrupt
	}
	st.Fingerprint = string(e[:fp])
	// The element is the driver's own copy: the result may keep it.
	st.Result = e[fp:]
	return st, nil
}

// stepArgs checks st and returns the prefix and the element that
// saveStepSQL takes (a nil element removes the step).
func stepArgs(st engine.Step) (prefix, elem []byte, err error) {
	if st.Name == "" || len(st.Name) > steps.MaxName {
		return nil, nil, fmt.Errorf("%w: a step's name takes 1 to %d bytes, not %d", engine.ErrNotStorable, steps.MaxName, len(st.Name))
	}
	if st.Fingerprint == "" {
		return stepPrefix(st.Name), nil, nil
	}
	if n := len(st.Name) + len(st.Fingerprint) + len(st.Result); n > steps.MaxSize {
		return nil, nil, fmt.Errorf("%w: a step of %d bytes, over %d", engine.ErrNotStorable, n, steps.MaxSize)
	}
	return stepPrefix(st.Name), encodeStep(st), nil
}

// What saveStepSQL answers.
const (
	stepSaved = 0
	stepFull  = 1
	stepLost  = 2
)

// stepResult turns saveStepSQL's answer into SaveStep's error.
func stepResult(verdict int32) error {
	switch verdict {
	case stepSaved:
		return nil
	case stepFull:
		return fmt.Errorf("%w: the record holds %d steps", engine.ErrNotStorable, steps.MaxSteps)
	}
	return engine.ErrLeaseLost
}
