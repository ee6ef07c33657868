package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

// Store is an engine.Store, engine.StepStore, engine.Inspector and
// engine.Binder that keeps its records in one SQLite file. Open returns one; it is safe for
// concurrent use, and several processes may open the same file.
type Store interface {
	engine.StepStore
	engine.Inspector
	engine.Binder
	// DB is the database the Store opened, for the application's own
	// tables in the same file (see TxFromContext). It stays the Store's:
	// Close closes it.
	DB() *sql.DB
	// Close stops the sweeper, rolls back the transactions of
	// transactional mode still open, and closes the database. After
	// Close every method fails with an error wrapping
	// engine.ErrStoreClosed. It is idempotent and returns the error of
	// closing the database, if any.
	Close() error
}

const (
	// busyTimeout is how long a statement waits for another process's
	// write lock before SQLite gives up; every call is bounded sooner by
	// its context, which the driver's busy handler watches.
	busyTimeout = 30 * time.Second
	// maxClaimAttempts bounds how often Claim reads the record again when
	// another claimer changed it between the read and the write.
	maxClaimAttempts = 8
	// sweepInterval and sweepBatch pace the sweeper: every interval it
	// deletes expired records, a batch per write transaction, until a
	// batch finds fewer.
	sweepInterval = time.Minute
	sweepBatch    = 1000
	// maxBlob is SQLite's default limit on a value's length.
	maxBlob = 1_000_000_000
)

var errContended = errors.New("record changed under every attempt")

type store struct {
	db            *sql.DB
	st            stmts
	transactional bool
	// write admits one writer of this process at a time: SQLite has one
	// writer per file, and a writer that waits here, in order, does not
	// poll the file lock as SQLite's busy handler does. In transactional
	// mode a lease holds it until its transaction ends.
	write chan struct{}
	txs   sqlrecord.Txs
	// now is the clock, the machine's, which every process sharing the
	// file reads.
	now func() int64

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	stopSweep context.CancelFunc
	sweepDone chan struct{}
	// firstSwept is closed when the sweep that Open starts has ended.
	firstSwept chan struct{}
}

var (
	_ Store            = (*store)(nil)
	_ engine.StepStore = (*store)(nil)
)

// Open opens, or creates, the SQLite database file at path in WAL mode,
// creates the table of records in it if it is missing (or adds to it the
// columns that an earlier version's table lacks), and starts the
// sweeper, a goroutine that deletes expired records every minute until
// Close. path is a file name: not ":memory:", not a "file:" URI, and
// without "?".
func Open(ctx context.Context, path string, opts ...Option) (Store, error) {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("sqlitestore: open: %q is not a file name", path)
	}
	syncMode := "NORMAL"
	if c.fullSync {
		syncMode = "FULL"
	}
	dsn := path + "?_pragma=busy_timeout(" + fmt.Sprint(busyTimeout.Milliseconds()) + ")" +
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(" + syncMode + ")&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open: %w", err)
	}
	if _, err := db.ExecContext(ctx, schemaSQL); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: open: %w", err)
	}
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: open: %w", err)
	}
	st, err := prepare(ctx, db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: open: %w", err)
	}
	s := &store{
		db:            db,
		st:            st,
		transactional: c.transactional,
		write:         make(chan struct{}, 1),
		now:           func() int64 { return time.Now().UnixMicro() },
	}
	sweepCtx, cancel := context.WithCancel(context.Background())
	s.stopSweep, s.sweepDone, s.firstSwept = cancel, make(chan struct{}), make(chan struct{})
	go s.sweepLoop(sweepCtx)
	return s, nil
}

func (s *store) DB() *sql.DB { return s.db }

func (s *store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stopSweep()
		<-s.sweepDone
		s.txs.CloseAll()
		s.st.close()
		s.closeErr = s.db.Close()
	})
	return s.closeErr
}

// begin checks ctx and that the store is open.
func (s *store) begin(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	}
	if s.closed.Load() {
		return fmt.Errorf("sqlitestore: %s: %w", op, engine.ErrStoreClosed)
	}
	return nil
}

// lock waits for this process's turn to write, within ctx; unlock ends it.
func (s *store) lock(ctx context.Context) error {
	select {
	case s.write <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *store) unlock() { <-s.write }

// exec runs a statement that writes, in this process's turn, and returns
// how many rows it changed.
func (s *store) exec(ctx context.Context, st *sql.Stmt, args ...any) (int64, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.unlock()
	r, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// read reads the record of id, live or not.
func (s *store) read(ctx context.Context, id engine.ID) (r sqlrecord.Row, found bool, err error) {
	err = r.Scan(s.st.read.QueryRowContext(ctx, []byte(id.Scope), []byte(id.Key)))
	if errors.Is(err, sql.ErrNoRows) {
		return sqlrecord.Row{}, false, nil
	}
	return r, err == nil, err
}

// take runs claimSQL, st: ok is false when the record could not be claimed.
// The claim returns the steps of a record it took over; decoding them is
// the one failure after the claim, which then stands (fail closed: the
// key stays in flight until its lease ends).
func (s *store) take(ctx context.Context, st *sql.Stmt, id engine.ID, fingerprint string, lease, ttl time.Duration) (c engine.Claim, ok bool, err error) {
	now := s.now()
	var (
		abandoned int64
		steps     []byte
	)
	err = st.QueryRowContext(ctx, []byte(id.Scope), []byte(id.Key), []byte(fingerprint), now,
		now+sqlrecord.Micros(lease), now+sqlrecord.Micros(sqlrecord.AddDur(lease, ttl))).Scan(&c.Token, &abandoned, &steps)
	if errors.Is(err, sql.ErrNoRows) {
		return engine.Claim{}, false, nil
	}
	if err != nil {
		return engine.Claim{}, false, err
	}
	if c.Steps, err = sqlrecord.DecodeSteps(steps); err != nil {
		return engine.Claim{}, false, err
	}
	c.Status, c.Abandoned = engine.Acquired, int(abandoned)
	return c, true, nil
}

// Claim reads the record first, which takes no lock: a replay, or a request
// in flight, is answered from that read alone. Otherwise claimSQL claims
// the key in one statement, in this process's turn to write; when another
// claimer got there between the read and the write, Claim reads again.
//
// In transactional mode the claim runs in a transaction (BEGIN IMMEDIATE)
// that stays open until Complete or Release, holding the file's write lock:
// every other write of every process waits for it, within its context.
func (s *store) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	if err := s.begin(ctx, "claim"); err != nil {
		return engine.Claim{}, err
	}
	for range maxClaimAttempts {
		r, found, err := s.read(ctx, id)
		if err != nil {
			return engine.Claim{}, s.fail("claim", err)
		}
		c, d, err := sqlrecord.Decide(r, found, fingerprint, s.now())
		if err != nil {
			return engine.Claim{}, fmt.Errorf("sqlitestore: claim: %w", err)
		}
		if d == sqlrecord.Answer {
			return c, nil
		}
		var ok bool
		if s.transactional {
			c, ok, err = s.claimTx(ctx, id, fingerprint, lease, ttl)
		} else {
			c, ok, err = s.claimOnce(ctx, id, fingerprint, lease, ttl)
		}
		if err != nil {
			return engine.Claim{}, s.fail("claim", err)
		}
		if ok {
			return c, nil
		}
	}
	return engine.Claim{}, fmt.Errorf("sqlitestore: claim: %w", errContended)
}

func (s *store) claimOnce(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, bool, error) {
	if err := s.lock(ctx); err != nil {
		return engine.Claim{}, false, err
	}
	defer s.unlock()
	return s.take(ctx, s.st.claim, id, fingerprint, lease, ttl)
}

// Complete stores the response in one statement, within the lease (two
// after it: see completeSQL); in transactional mode in the lease's
// transaction, which it then commits.
func (s *store) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if s.transactional && ctx.Err() != nil && !s.closed.Load() {
		return s.abortTx("complete", id, token, ctx.Err())
	}
	if err := s.begin(ctx, "complete"); err != nil {
		return err
	}
	if resp == nil {
		return errors.New("sqlitestore: complete: nil response")
	}
	headers := sqlrecord.EncodeHeader(resp.Header)
	if err := storable(resp, headers); err != nil {
		return fmt.Errorf("sqlitestore: complete: %w", err)
	}
	if s.transactional {
		return s.completeTx(ctx, id, token, resp, headers, ttl)
	}
	now := s.now()
	args := []any{int64(token), []byte(id.Scope), []byte(id.Key), now, now + sqlrecord.Micros(ttl), resp.Status, headers, body(resp), resp.BodyOmitted}
	n, err := s.exec(ctx, s.st.complete, args...)
	if err == nil && n == 0 {
		n, err = s.exec(ctx, s.st.completeLate, args...)
	}
	return s.result("complete", n, err)
}

// Release makes a record that the holder's claim created expire, so that
// the key is new again; one that the claim took over from lost holders, or
// that holds steps, goes back to how the claim found it, with a new token.
// In transactional mode it rolls the lease's transaction back, steps
// included.
func (s *store) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	if s.transactional && ctx.Err() != nil && !s.closed.Load() {
		return s.abortTx("release", id, token, ctx.Err())
	}
	if err := s.begin(ctx, "release"); err != nil {
		return err
	}
	if s.transactional {
		return s.releaseTx(id, token)
	}
	now := s.now()
	n, err := s.exec(ctx, s.st.release, int64(token), []byte(id.Scope), []byte(id.Key), now)
	if err == nil && n == 0 {
		n, err = s.exec(ctx, s.st.releaseBack, int64(token), []byte(id.Scope), []byte(id.Key), now)
	}
	return s.result("release", n, err)
}

// Extend moves the lease's end in one statement. In transactional mode it
// changes nothing and succeeds while the lease's transaction is open: the
// transaction's lock, not a lease, keeps others off the record.
func (s *store) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	if err := s.begin(ctx, "extend"); err != nil {
		return err
	}
	if s.transactional {
		if !s.txs.Has(id, token) {
			return fmt.Errorf("sqlitestore: extend: %w", engine.ErrLeaseLost)
		}
		return nil
	}
	now := s.now()
	n, err := s.exec(ctx, s.st.extend, int64(token), []byte(id.Scope), []byte(id.Key), now, now+sqlrecord.Micros(lease))
	return s.result("extend", n, err)
}

// result turns the outcome of a statement conditional on the token into
// Complete's, Release's or Extend's.
func (s *store) result(op string, n int64, err error) error {
	if err != nil {
		if isTooBig(err) {
			return fmt.Errorf("sqlitestore: %s: %w: %w", op, engine.ErrNotStorable, err)
		}
		return s.fail(op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlitestore: %s: %w", op, engine.ErrLeaseLost)
	}
	return nil
}

// fail wraps the error of op; once the Store is closed, a call that was
// under way when Close closed the database fails with engine.ErrStoreClosed
// too, whatever the database answered.
func (s *store) fail(op string, err error) error {
	if s.closed.Load() && !errors.Is(err, engine.ErrStoreClosed) {
		return fmt.Errorf("sqlitestore: %s: %w: %w", op, engine.ErrStoreClosed, err)
	}
	return fmt.Errorf("sqlitestore: %s: %w", op, err)
}

// storable refuses a response that SQLite cannot keep in one row.
func storable(resp *engine.Response, headers []byte) error {
	if err := sqlrecord.CheckStatus(resp); err != nil {
		return err
	}
	if len(resp.Body) > maxBlob || len(headers) > maxBlob {
		return fmt.Errorf("response of %d bytes: %w", len(resp.Body)+len(headers), engine.ErrNotStorable)
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

func isTooBig(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_TOOBIG
}

// sweepLoop sweeps every sweepInterval until ctx ends.
func (s *store) sweepLoop(ctx context.Context) {
	defer close(s.sweepDone)
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for first := true; ; first = false {
		s.sweep(ctx, sweepBatch)
		if first {
			close(s.firstSwept)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep deletes the expired records, batch by batch, and returns how many;
// a failure ends it, and the next sweep tries again.
func (s *store) sweep(ctx context.Context, batch int) int64 {
	var total int64
	for ctx.Err() == nil {
		n, err := s.exec(ctx, s.st.sweep, s.now(), batch)
		total += n
		if err != nil || n < int64(batch) {
			break
		}
	}
	return total
}
