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

// Lookup implements engine.Inspector: one read, which takes no lock. In
// transactional mode a request being served is invisible to it, since its
// record commits with its response or not at all.
func (s *store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	if err := s.begin(ctx, "lookup"); err != nil {
		return engine.Record{}, err
	}
	var r sqlrecord.Row
	err := r.Scan(s.st.lookup.QueryRowContext(ctx, []byte(id.Scope), []byte(id.Key)), &r.Steps)
	if errors.Is(err, sql.ErrNoRows) {
		return engine.Record{}, fmt.Errorf("sqlitestore: lookup: %w", engine.ErrNotFound)
	}
	if err != nil {
		return engine.Record{}, s.fail("lookup", err)
	}
	if r.Expires <= s.now() {
		return engine.Record{}, fmt.Errorf("sqlitestore: lookup: %w", engine.ErrNotFound)
	}
	rec, err := r.Record(id)
	if err != nil {
		return engine.Record{}, fmt.Errorf("sqlitestore: lookup: %w", err)
	}
	return rec, nil
}

// Resolve implements engine.Inspector, in one statement: with resp it
// records the request as done with resp, and the holder of a lease in
// flight is refused from then on; with resp nil the record expires at
// once, so that the next request with the key runs.
func (s *store) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	if err := s.begin(ctx, "resolve"); err != nil {
		return err
	}
	now := s.now()
	var (
		n   int64
		err error
	)
	if resp == nil {
		n, err = s.exec(ctx, s.st.forget, []byte(id.Scope), []byte(id.Key), now)
	} else {
		headers := sqlrecord.EncodeHeader(resp.Header)
		if err := storable(resp, headers); err != nil {
			return fmt.Errorf("sqlitestore: resolve: %w", err)
		}
		n, err = s.exec(ctx, s.st.resolve, []byte(id.Scope), []byte(id.Key), now, now+sqlrecord.Micros(ttl),
			resp.Status, headers, body(resp), resp.BodyOmitted)
	}
	switch {
	case err != nil:
		return s.fail("resolve", err)
	case n == 0:
		return fmt.Errorf("sqlitestore: resolve: %w", engine.ErrNotFound)
	}
	return nil
}
