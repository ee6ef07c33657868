package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// Store is an engine.Store, engine.StepStore, engine.Inspector and
// engine.Binder that keeps its records in one MySQL or MariaDB table. New returns one; it is safe
// for concurrent use, by any number of instances sharing the table.
type Store interface {
	engine.StepStore
	engine.Inspector
	engine.Binder
	// Migrate creates the table if it is missing, and adds to a table
	// made by an earlier version the columns it lacks (see the package
	// documentation). Instances may run it at once.
	Migrate(ctx context.Context) error
	// Close stops the sweeper, rolls back the transactions of
	// transactional mode still open, and closes the statements the Store
	// prepared on the database; call it once the server has stopped
	// serving. After Close, Claim fails with an error wrapping
	// engine.ErrStoreClosed; Complete, Release and Extend still work in
	// lease mode, unprepared, so that requests finishing during a shutdown
	// are recorded. The database stays the caller's. Close is idempotent
	// and returns nil.
	Close() error
}

// defaultTable is the table of the records unless WithTable names another.
const defaultTable = "idempotency_records"

const (
	// maxClaimAttempts bounds how often Claim reads the record again when
	// another claimer changed it between the read and the write.
	maxClaimAttempts = 8
	// sweepInterval and sweepBatch pace the sweeper.
	sweepInterval = time.Minute
	sweepBatch    = 1000
	// lockWait is how long, in transactional mode, a Claim waits for
	// another transaction that holds its key (innodb_lock_wait_timeout,
	// whose least value it is) before it answers InFlight.
	lockWait = time.Second
)

var (
	errContended = errors.New("record changed under every attempt")
	tableName    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63})?$`)
)

type store struct {
	db            *sql.DB
	q             queries
	p             *prepared
	transactional bool
	txs           sqlrecord.Txs

	closed    atomic.Bool
	closeOnce sync.Once
	stopSweep context.CancelFunc
	sweepDone chan struct{}
}

var (
	_ Store            = (*store)(nil)
	_ engine.StepStore = (*store)(nil)
)

// New returns a Store on db, the application's own database handle of
// github.com/go-sql-driver/mysql, in the table idempotency_records or the one that
// WithTable names. It does no I/O: call Migrate before the first Claim. It
// starts the sweeper, a goroutine that deletes expired records every minute
// until Close. db stays the caller's.
func New(db *sql.DB, opts ...Option) (Store, error) {
	if db == nil {
		return nil, errors.New("mysqlstore: nil database")
	}
	c := config{table: defaultTable}
	for _, o := range opts {
		o(&c)
	}
	if !tableName.MatchString(c.table) {
		return nil, fmt.Errorf("mysqlstore: table %q: want a name of letters, digits and underscores, or database.table", c.table)
	}
	quoted := ""
	for i, part := range splitTable(c.table) {
		if i > 0 {
			quoted += "."
		}
		quoted += "`" + part + "`"
	}
	s := &store{db: db, q: newQueries(quoted), p: &prepared{db: db}, transactional: c.transactional}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopSweep, s.sweepDone = cancel, make(chan struct{})
	go s.sweepLoop(ctx)
	return s, nil
}

func splitTable(t string) []string {
	for i := range len(t) {
		if t[i] == '.' {
			return []string{t[:i], t[i+1:]}
		}
	}
	return []string{t}
}

func (s *store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.q.schema); err != nil {
		return fmt.Errorf("mysqlstore: migrate: %w", err)
	}
	if err := s.migrateSteps(ctx); err != nil {
		return fmt.Errorf("mysqlstore: migrate: %w", err)
	}
	return nil
}

func (s *store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stopSweep()
		<-s.sweepDone
		s.txs.CloseAll()
		s.p.close()
	})
	return nil
}

// seen is what a Claim read: the record, if found (with its steps if the
// Claim may take it over), its version and the server's clock.
type seen struct {
	row          sqlrecord.Row
	found        bool
	now, version int64
}

// read reads the record of id, live or not, and the server's clock; in tx
// unless it is nil.
func (s *store) read(ctx context.Context, tx *sql.Tx, id engine.ID) (seen, error) {
	var v seen
	err := s.p.queryRow(ctx, tx, func(r *sql.Row) error { return v.row.Scan(r, &v.now, &v.version, &v.row.Steps) },
		s.q.read, []byte(id.Scope), []byte(id.Key))
	if errors.Is(err, sql.ErrNoRows) {
		return seen{version: -1}, nil
	}
	v.found = err == nil
	return v, err
}

// take runs claimSQL for the row that the read saw: ok is false when it
// changed nothing. The row's steps are decoded first, so that a log that
// cannot be decoded fails the Claim before it writes.
func (s *store) take(ctx context.Context, tx *sql.Tx, id engine.ID, fingerprint string, lease, ttl time.Duration, v seen) (engine.Claim, bool, error) {
	var steps []engine.Step
	if v.found && v.row.Expires > v.now {
		var err error
		if steps, err = sqlrecord.DecodeSteps(v.row.Steps); err != nil {
			return engine.Claim{}, false, err
		}
	}
	res, err := s.p.exec(ctx, tx, s.q.claim, s.q.claimArgs([]byte(id.Scope), []byte(id.Key), []byte(fingerprint),
		sqlrecord.Micros(lease), sqlrecord.Micros(sqlrecord.AddDur(lease, ttl)), v.version)...)
	if err != nil {
		return engine.Claim{}, false, err
	}
	token, n, err := outcome(res)
	if err != nil || token == 0 {
		return engine.Claim{}, false, err
	}
	c := engine.Claim{Status: engine.Acquired, Token: engine.Token(token)}
	switch {
	case n == 1: // inserted
	case !v.found:
		return engine.Claim{}, false, fmt.Errorf("claim took over a row it never read (%d rows affected)", n)
	case v.row.Expires > v.now:
		c.Abandoned = int(min(v.row.Abandoned, 2147483646) + 1)
		c.Steps = steps
	}
	return c, true, nil
}

// outcome reads what claimSQL did: token 0 when it changed nothing,
// otherwise the token, with n 1 for an insert and 2 for a takeover.
func outcome(res sql.Result) (token, n int64, err error) {
	if token, err = res.LastInsertId(); err != nil {
		return 0, 0, err
	}
	if n, err = res.RowsAffected(); err != nil {
		return 0, 0, err
	}
	if token != 0 && n != 1 && n != 2 {
		return 0, 0, fmt.Errorf("claim affected %d rows, want 1 or 2", n)
	}
	return token, n, nil
}

// Claim reads the record first, with a consistent read that takes no lock:
// a replay, or a request in flight, is answered by that read alone.
// Otherwise claimSQL claims the key, or takes it over, in one statement;
// when another claimer changed the record between the read and the write,
// Claim reads again.
//
// In transactional mode the claim runs in a transaction that stays open
// until Complete or Release. A Claim that finds another transaction holding
// the key waits for it for at most a second (innodb_lock_wait_timeout):
// when that one commits, Claim returns its record, Completed; when it rolls
// back, Claim acquires; when the wait times out, Claim returns InFlight,
// with RetryAfter a second and the caller's own fingerprint, since the
// other transaction's row cannot be read before it commits.
func (s *store) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	if err := ctx.Err(); err != nil {
		return engine.Claim{}, fmt.Errorf("mysqlstore: claim: %w", err)
	}
	if s.closed.Load() {
		return engine.Claim{}, fmt.Errorf("mysqlstore: claim: %w", engine.ErrStoreClosed)
	}
	var (
		c   engine.Claim
		err error
	)
	if s.transactional {
		c, err = s.claimTx(ctx, id, fingerprint, lease, ttl)
	} else {
		c, err = s.claim(ctx, nil, id, fingerprint, lease, ttl)
	}
	if err != nil {
		return engine.Claim{}, fmt.Errorf("mysqlstore: claim: %w", err)
	}
	return c, nil
}

func (s *store) claim(ctx context.Context, tx *sql.Tx, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	for range maxClaimAttempts {
		v, err := s.read(ctx, tx, id)
		if err != nil {
			return engine.Claim{}, err
		}
		c, d, err := sqlrecord.Decide(v.row, v.found, fingerprint, v.now)
		if err != nil || d == sqlrecord.Answer {
			return c, err
		}
		c, ok, err := s.take(ctx, tx, id, fingerprint, lease, ttl, v)
		if err != nil || ok {
			return c, err
		}
	}
	return engine.Claim{}, errContended
}

// Complete stores the response in one statement; in transactional mode in
// the lease's transaction, which it then commits.
func (s *store) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if err := ctx.Err(); err != nil && s.transactional {
		return s.abortTx("complete", id, token, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mysqlstore: complete: %w", err)
	}
	if resp == nil {
		return errors.New("mysqlstore: complete: nil response")
	}
	headers := sqlrecord.EncodeHeader(resp.Header)
	if err := sqlrecord.CheckStatus(resp); err != nil {
		return fmt.Errorf("mysqlstore: complete: %w", err)
	}
	args := []any{sqlrecord.Micros(ttl), resp.Status, headers, body(resp), resp.BodyOmitted, []byte(id.Scope), []byte(id.Key), int64(token)}
	if s.transactional {
		return s.completeTx(ctx, id, token, args)
	}
	n, err := s.exec(ctx, nil, s.q.complete, args...)
	return result("complete", n, err)
}

// Release makes a record that the holder's claim created expire, so that the
// key is new again; one that the claim took over from lost holders, or that
// holds steps, goes back to how the claim found it, with a new token. Two
// statements at most, each conditional on the token. In transactional mode
// it rolls the lease's transaction back, steps included.
func (s *store) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	if err := ctx.Err(); err != nil && s.transactional {
		return s.abortTx("release", id, token, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mysqlstore: release: %w", err)
	}
	if s.transactional {
		return s.releaseTx(id, token)
	}
	args := []any{[]byte(id.Scope), []byte(id.Key), int64(token)}
	n, err := s.exec(ctx, nil, s.q.release, args...)
	if err == nil && n == 0 {
		n, err = s.exec(ctx, nil, s.q.releaseBack, args...)
	}
	return result("release", n, err)
}

// Extend moves the lease's end in one statement. In transactional mode it
// changes nothing and succeeds while the lease's transaction is open: the
// row lock, not a lease, keeps others off the record.
func (s *store) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mysqlstore: extend: %w", err)
	}
	if s.transactional {
		if !s.txs.Has(id, token) {
			return fmt.Errorf("mysqlstore: extend: %w", engine.ErrLeaseLost)
		}
		return nil
	}
	us := sqlrecord.Micros(lease)
	n, err := s.exec(ctx, nil, s.q.extend, us, us, []byte(id.Scope), []byte(id.Key), int64(token))
	return result("extend", n, err)
}

// exec runs a statement, in tx unless it is nil, and returns how many rows
// it changed.
func (s *store) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	r, err := s.p.exec(ctx, tx, query, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// result turns the outcome of a statement conditional on the token into
// Complete's, Release's or Extend's.
func result(op string, n int64, err error) error {
	if err != nil {
		if isNotStorable(err) {
			return fmt.Errorf("mysqlstore: %s: %w: %w", op, engine.ErrNotStorable, err)
		}
		return fmt.Errorf("mysqlstore: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("mysqlstore: %s: %w", op, engine.ErrLeaseLost)
	}
	return nil
}

// body is the body to store: never NULL, so that an empty body reads back.
func body(resp *engine.Response) []byte {
	if resp.Body == nil {
		return []byte{}
	}
	return resp.Body
}

// MySQL error numbers the store tells apart.
const (
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
	errPacketTooLarge  = 1153
	errBadField        = 1054 // unknown column
	errDupFieldName    = 1060 // duplicate column name
)

// isNotStorable reports a response larger than the server's
// max_allowed_packet, refused by the driver before sending or by the
// server.
func isNotStorable(err error) bool {
	var e *mysql.MySQLError
	return errors.Is(err, mysql.ErrPktTooLarge) || errors.As(err, &e) && e.Number == errPacketTooLarge
}

func isErr(err error, number uint16) bool {
	var e *mysql.MySQLError
	return errors.As(err, &e) && e.Number == number
}

// sweepLoop sweeps every sweepInterval until ctx ends.
func (s *store) sweepLoop(ctx context.Context) {
	defer close(s.sweepDone)
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweep(ctx, sweepBatch)
	}
}

// sweep deletes records expired more than a second ago, batch by batch, and
// returns how many; a failure ends it, and the next sweep tries again.
func (s *store) sweep(ctx context.Context, batch int) int64 {
	var total int64
	for ctx.Err() == nil {
		n, err := s.exec(ctx, nil, s.q.sweep, batch)
		total += n
		if err != nil || n < int64(batch) {
			break
		}
	}
	return total
}
