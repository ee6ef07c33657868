package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// Lookup implements engine.Inspector: one consistent read. In
// transactional mode a request being served is invisible to it, since its
// record commits with its response or not at all.
func (s *store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	var (
		r            sqlrecord.Row
		now, version int64
	)
	err := s.p.queryRow(ctx, nil, func(row *sql.Row) error { return r.Scan(row, &now, &version, &r.Steps) },
		s.q.lookup, []byte(id.Scope), []byte(id.Key))
	if errors.Is(err, sql.ErrNoRows) {
		return engine.Record{}, fmt.Errorf("mysqlstore: lookup: %w", engine.ErrNotFound)
	}
	if err != nil {
		return engine.Record{}, fmt.Errorf("mysqlstore: lookup: %w", err)
	}
	rec, err := r.Record(id)
	if err != nil {
		return engine.Record{}, fmt.Errorf("mysqlstore: lookup: %w", err)
	}
	return rec, nil
}

// Resolve implements engine.Inspector, in one statement: with resp it
// records the request as done with resp, and the holder of a lease in
// flight is refused from then on; with resp nil the record expires at
// once, so that the next request with the key runs.
func (s *store) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	var (
		n   int64
		err error
	)
	if resp == nil {
		n, err = s.exec(ctx, nil, s.q.forget, []byte(id.Scope), []byte(id.Key))
	} else {
		if err := sqlrecord.CheckStatus(resp); err != nil {
			return fmt.Errorf("mysqlstore: resolve: %w", err)
		}
		n, err = s.exec(ctx, nil, s.q.resolve, sqlrecord.Micros(ttl), resp.Status, sqlrecord.EncodeHeader(resp.Header),
			body(resp), resp.BodyOmitted, []byte(id.Scope), []byte(id.Key))
	}
	switch {
	case isNotStorable(err):
		return fmt.Errorf("mysqlstore: resolve: %w: %w", engine.ErrNotStorable, err)
	case err != nil:
		return fmt.Errorf("mysqlstore: resolve: %w", err)
	case n == 0:
		return fmt.Errorf("mysqlstore: resolve: %w", engine.ErrNotFound)
	}
	return nil
}
