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

// lookupRow is a row of lookupSQL.
type lookupRow struct {
	state       string
	fingerprint string
	token       int64
	abandoned   int32
	created     time.Time
	leaseUntil  time.Time
	expires     time.Time
	live        bool
	remaining   int64
	status      int32
	headers     []byte
	body        []byte
	bodyOmitted bool
	steps       [][]byte
}

// lookup reads the live record for id; found is false when there is none.
func (s *store) lookup(ctx context.Context, id engine.ID) (r lookupRow, found bool, err error) {
	err = s.retry(ctx, func() error {
		r = lookupRow{}
		return s.pool.QueryRow(ctx, s.stmts().lookup, s.coldMode, []byte(id.Scope), []byte(id.Key)).Scan(
			&r.state, (*stringScanner)(&r.fingerprint), &r.token, &r.abandoned, &r.created, &r.leaseUntil,
			&r.expires, &r.live, &r.remaining, &r.status, &r.headers, &r.body, &r.bodyOmitted, &r.steps)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return lookupRow{}, false, nil
	}
	return r, err == nil, err
}

// Lookup implements engine.Inspector: one statement, which a read-only
// server (a standby) answers too. A record in flight reports its steps. In transactional mode a request being
// served is invisible to it, as to every other session, since its record
// commits with its response or not at all: Lookup then returns an error
// wrapping engine.ErrNotFound, and a completed record once it commits.
func (s *store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	r, found, err := s.lookup(ctx, id)
	if err != nil {
		return engine.Record{}, fmt.Errorf("pgstore: lookup: %w", err)
	}
	if !found {
		return engine.Record{}, fmt.Errorf("pgstore: lookup: %w", engine.ErrNotFound)
	}
	rec := engine.Record{
		ID:          id,
		Completed:   r.state == "completed",
		Fingerprint: r.fingerprint,
		Token:       engine.Token(r.token),
		// A record that the holder who created it released, and kept for
		// its steps, counts -1 until its takeover (see releaseSQL).
		Abandoned: max(int(r.abandoned), 0),
		Created:   r.created,
		Expires:   r.expires,
	}
	if !rec.Completed {
		rec.LeaseEnds = r.leaseUntil
		if rec.Steps, err = decodeSteps(r.steps); err != nil {
			return engine.Record{}, fmt.Errorf("pgstore: lookup: %w", err)
		}
		return rec, nil
	}
	h, err := sqlrecord.DecodeHeader(r.headers)
	if err != nil {
		return engine.Record{}, fmt.Errorf("pgstore: lookup: %w", err)
	}
	rec.Response = &engine.Response{Status: int(r.status), Header: h, Body: r.body, BodyOmitted: r.bodyOmitted}
	return rec, nil
}

// Resolve implements engine.Inspector, in one statement. With resp set it
// records the request as done with resp, whatever the record's state, drops
// its steps, and
// the holder of a lease in flight is refused from then on (its Complete,
// Release and Extend fail with engine.ErrLeaseLost); with resp nil it
// deletes the record. A response that can never be stored is refused with
// an error wrapping engine.ErrNotStorable, as by Complete.
//
// In transactional mode a request being served is invisible (see [Store.Lookup]):
// Resolve then returns an error wrapping engine.ErrNotFound, and a
// transaction that took over an expired record holds it, so that Resolve
// waits for that transaction to end, within ctx.
func (s *store) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: resolve: %w", err)
	}
	var (
		sql  string
		args []any
	)
	if resp == nil {
		sql, args = s.stmts().forget, []any{s.coldMode, []byte(id.Scope), []byte(id.Key)}
	} else {
		headers := sqlrecord.EncodeHeader(resp.Header)
		if err := storable(id, resp, headers); err != nil {
			return fmt.Errorf("pgstore: resolve: %w", err)
		}
		sql, args = s.stmts().resolve, []any{s.coldMode, []byte(id.Scope), []byte(id.Key), micros(ttl),
			int32(resp.Status), headers, resp.Body, resp.BodyOmitted}
	}
	var tag pgconn.CommandTag
	err := s.retry(ctx, func() (err error) {
		tag, err = s.pool.Exec(ctx, sql, args...)
		return err
	})
	switch {
	case isNotStorable(err):
		return fmt.Errorf("pgstore: resolve: %w: %w", engine.ErrNotStorable, err)
	case err != nil:
		return fmt.Errorf("pgstore: resolve: %w", err)
	case tag.RowsAffected() == 0:
		return fmt.Errorf("pgstore: resolve: %w", engine.ErrNotFound)
	}
	return nil
}
