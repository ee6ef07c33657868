package pgstore

import (
	"context"
	"errors"
	"math/bits"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// How the Store's statements are planned.
//
// pgx prepares each statement once per connection, by default, and after
// five executions PostgreSQL may switch a prepared statement to a generic
// plan, made once with the table's size of that moment and kept until the
// table's statistics change. Made while the table fits in a few pages, that
// plan is a sequential scan, cheaper than the index there, and it stays one
// as the table grows to millions of rows: every statement then reads the
// whole table. Planning at each execution instead (unnamed statements)
// would cost the backend more CPU than the statement itself.
//
// So the Store keeps prepared statements, and lets their plans follow the
// table's size: a Claim a second reads the table's size, and the statements that
// run on every request are written once per plan epoch, a power of two of
// the table's pages, so that when the table doubles the next statements are
// new ones, which PostgreSQL plans for the table as it is. From maxPlanEpoch
// (32 pages and more) a generic plan uses the index, and the statements stay
// the same however the table grows.

// maxPlanEpoch is the last plan epoch: tables of 2^(maxPlanEpoch-1) pages
// and more.
const maxPlanEpoch = 6

// pageSize is PostgreSQL's default block size. Another one only moves the
// epochs' bounds.
const pageSize = 8192

// planEpoch returns the epoch of a table of the given size in bytes.
func planEpoch(size int64) int {
	if size <= 0 {
		return 0
	}
	return min(bits.Len64(uint64(size/pageSize)), maxPlanEpoch)
}

// stmts returns the statements for the table's last known size.
func (s *store) stmts() *queries { return &s.plans[s.epoch.Load()] }

// sizeInterval is how often a Claim reads the table's size: the size
// costs the server a look at the table's files, and the epochs are
// doublings of it, which take far longer than this to come.
const sizeInterval = time.Second

// sizeDue reports whether this Claim is to read the table's size: the first
// one, and then one a sizeInterval, whichever Claim comes first.
func (s *store) sizeDue() bool {
	now := time.Now().UnixNano()
	last := s.sizedAt.Load()
	return now-last >= int64(sizeInterval) && s.sizedAt.CompareAndSwap(last, now)
}

// observeSize moves the Store to the plan epoch of the table's size, when
// size was read (it is -1 when not).
func (s *store) observeSize(size int64) {
	if size < 0 {
		return
	}
	if e := int32(planEpoch(size)); s.epoch.Load() != e {
		s.epoch.Store(e)
	}
}

// hotMode is how the statements of every request are sent: prepared, in
// pgx's default mode, unless the server refused prepared statements (see
// refusesPrepared), or the pool has another mode of its own.
func (s *store) hotMode() pgx.QueryExecMode {
	if s.unprepared.Load() {
		return s.coldMode
	}
	return s.poolMode
}

// unnamedMode returns the mode in which the Store sends unnamed statements
// on connections of config c: the pool's own, unless it is pgx's default,
// which prepares named statements. Unnamed statements are planned at each
// execution, for the table as it is, and work through a pooler in
// transaction mode.
func unnamedMode(c *pgx.ConnConfig) pgx.QueryExecMode {
	switch {
	case c.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement:
		return c.DefaultQueryExecMode
	case c.DescriptionCacheCapacity == 0:
		return pgx.QueryExecModeDescribeExec
	}
	return pgx.QueryExecModeCacheDescribe
}

// refusesPrepared reports whether err says that a prepared statement that
// pgx made is not on the server connection it used, or that one of the
// name is there already: a pooler in transaction mode (PgBouncer) hands
// each transaction to any of its server connections. The statement did not
// run: the server refuses it at Parse or Bind.
func refusesPrepared(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") // duplicate_prepared_statement, invalid_sql_statement_name
}

// notePrepared switches the Store to unnamed statements, for good, when err
// shows that the server connections do not keep prepared statements, and
// reports whether it did.
func (s *store) notePrepared(err error) bool {
	if err == nil || !refusesPrepared(err) {
		return false
	}
	if s.unprepared.CompareAndSwap(false, true) {
		s.log.Warn("pgstore: the server refused a prepared statement (a pooler in transaction mode?): "+
			"sending unnamed statements from now on; set the pool's DefaultQueryExecMode to "+
			"pgx.QueryExecModeCacheDescribe to start so", "err", err)
	}
	return true
}

// retry runs f, and once more when it failed before its statement ran: on a
// connection that the server closed while it sat idle in the pool, or on a
// prepared statement that the server connection did not have (after which
// the Store sends unnamed statements).
func (s *store) retry(ctx context.Context, f func() error) error {
	err := f()
	if err != nil && ctx.Err() == nil && (closedWhileIdle(err) || s.notePrepared(err)) {
		err = f()
	}
	return err
}
