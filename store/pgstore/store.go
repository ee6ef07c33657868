package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
)

const (
	// maxClaimAttempts bounds how often Claim runs its statement again when
	// a concurrent claimer changed the record under it. Each attempt that
	// found nothing has waited for that claimer's transaction to end, so the
	// next one sees its row: two attempts are the norm, more are very rare.
	maxClaimAttempts = 8
	// cleanupTimeout bounds a rollback done after the caller's context
	// ended.
	cleanupTimeout = 5 * time.Second
)

var errContended = errors.New("record changed under every attempt")

// Store is an engine.Store backed by one PostgreSQL table: it keeps steps
// (engine.StepStore), lets an operator inspect its records
// (engine.Inspector), and binds the handler to a transaction in
// transactional mode (engine.Binder). Create one with New, create its table
// with Migrate (or apply Schema yourself), and call Close when done. It is
// safe for concurrent use, by any number of instances of an API sharing the
// table.
type Store interface {
	engine.StepStore
	engine.Inspector
	engine.Binder
	// Migrate creates the Store's table, sequence and index unless they exist,
	// and brings a table created by an earlier version of the package up to
	// date, once: it adds the columns it lacks (abandoned, sweep_at and steps,
	// with their defaults: a change of the catalog only, which holds the table's
	// lock for a moment), builds the index on sweep_at (which makes writes to the
	// table wait while it reads the table: on a large one, create it first with
	// CREATE INDEX CONCURRENTLY) and drops the first versions' index on
	// expires_at. It is safe to call from several instances at once: it applies
	// the schema in one transaction that holds the advisory lock 0x69646d6b70677374 ("idmkpgst"),
	// so the instances take turns and all but the first find everything in
	// place.
	//
	// When everything exists, Migrate only looks: it takes no lock on the table,
	// so an instance that starts while others serve requests does not make them
	// wait. (CREATE INDEX IF NOT EXISTS would: it locks the table against writes
	// before it finds the index, and waits for every open transaction that
	// wrote to it, as transactional mode's do for as long as their handlers
	// run.)
	Migrate(ctx context.Context) error
	// Sweep deletes the records that have expired, batch at a time (a batch below
	// 1 means 1000), until a statement finds fewer than batch to
	// delete, and returns how many it deleted. Each batch is one short statement
	// and transaction, which locks only the rows it deletes and skips those that
	// are locked, so a sweep of a million rows never makes a Claim wait for more
	// than one batch, nor two sweepers wait for each other.
	//
	// Sweeping is housekeeping, not correctness: Claim treats an expired record
	// as absent whether or not it was swept. Call Sweep from a scheduled job, or
	// let WithSweeper call it.
	Sweep(ctx context.Context, batch int) (deleted int, err error)
	// Close stops the background sweeper, if any, and waits for it to end; in
	// transactional mode it rolls back the transactions still open, so call it
	// once the server has stopped serving. After Close, Claim fails with
	// engine.ErrStoreClosed; Complete, Release and Extend still work on the leases of lease
	// mode, so that requests finishing during a shutdown are recorded. Close is
	// idempotent and always returns nil.
	Close() error
}

// store is the Store that New makes.
type store struct {
	pool  *pgxpool.Pool
	names names
	// plans holds the statements of each plan epoch; epoch is the current
	// one (see plans.go).
	plans [maxPlanEpoch + 1]queries
	epoch atomic.Int32
	// sizedAt is when a Claim last read the table's size (UnixNano).
	sizedAt atomic.Int64
	// found weighs the last claims: up for one that found a record, down
	// for one that inserted it (see readFirst).
	found atomic.Int32
	// recent remembers the keys of the last claims, which read first when
	// they come again (see recentKeys).
	recent *recentKeys
	// claimPath, when not 0, fixes how a claim reads the key: tests run
	// each path so.
	claimPath claimPath
	// poolMode sends the statements of every request, coldMode the others
	// and, once unprepared is set, all of them.
	poolMode, coldMode pgx.QueryExecMode
	unprepared         atomic.Bool
	transactional      bool
	lockTimeout        time.Duration
	idleTimeout        time.Duration
	beginSQL           string
	log                *slog.Logger

	closed    atomic.Bool
	closeOnce sync.Once
	// stopSweep and sweepDone are nil without a sweeper.
	stopSweep context.CancelFunc
	sweepDone chan struct{}

	// mu guards txs, the open transactions of transactional mode, and
	// watching, whether a watcher runs (see txwatch.go).
	mu       sync.Mutex
	txs      map[txKey]*openTx
	watching bool
	// watchCtx ends with Close, which stops the watcher; watchers counts
	// the watchers running. watchEvery is how often one looks.
	watchCtx   context.Context
	stopWatch  context.CancelFunc
	watchers   sync.WaitGroup
	watchEvery time.Duration
}

var (
	_ Store = (*store)(nil)
)

// New returns a Store that keeps its records in a table of the database that
// pool connects to: "idempotency_records", or the one named by WithTable. It does no
// I/O: call Migrate, or apply Schema, before the first Claim. The pool stays
// the caller's: Close does not close it.
//
// With WithSweeper, New starts a goroutine that runs until Close.
func New(pool *pgxpool.Pool, opts ...Option) (Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: nil pool")
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	n, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	s := &store{
		pool:          pool,
		names:         n,
		transactional: c.transactional,
		lockTimeout:   c.lockTimeout,
		idleTimeout:   c.idleTimeout,
		log:           c.logger,
		txs:           make(map[txKey]*openTx),
		recent:        newRecentKeys(),
	}
	if s.transactional {
		s.watchCtx, s.stopWatch = context.WithCancel(context.Background())
		s.watchEvery = watchInterval(c.idleTimeout)
	}
	s.beginSQL = beginSQL(c.lockTimeout, c.idleTimeout)
	for e := range s.plans {
		s.plans[e] = newQueries(n, e, c.transactional)
	}
	cc := pool.Config().ConnConfig
	s.poolMode, s.coldMode = cc.DefaultQueryExecMode, unnamedMode(cc)
	if c.sweepInterval > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopSweep, s.sweepDone = cancel, make(chan struct{})
		go s.sweepLoop(ctx, c.sweepInterval, c.sweepBatch)
	}
	return s, nil
}

// beginSQL is the statement that begins a transaction of transactional
// mode: READ COMMITTED, whatever the session's default, so that a statement
// run again sees what committed since the last one; the lock timeout; the
// idle timeout unless it is zero. The settings are in milliseconds,
// saturated at PostgreSQL's maximum (math.MaxInt32, 24 days), and end with
// the transaction.
//
// The lock timeout is at most half the session's statement_timeout, when
// one is set: a Claim that waits for a concurrent transaction then ends
// with the lock timeout, which it answers InFlight (409), before the
// statement timeout, which it could only report as a failure (503).
func beginSQL(lockTimeout, idleTimeout time.Duration) string {
	ms := func(d time.Duration) string {
		return strconv.FormatInt(min(max(d.Milliseconds(), 1), math.MaxInt32), 10)
	}
	q := "BEGIN ISOLATION LEVEL READ COMMITTED; " +
		"SELECT set_config('lock_timeout', (CASE WHEN st > 0 THEN least(" + ms(lockTimeout) + ", greatest(st / 2, 1)) " +
		"ELSE " + ms(lockTimeout) + " END)::bigint::text, true) " +
		"FROM (SELECT extract(epoch FROM current_setting('statement_timeout')::interval) * 1000 AS st) AS s"
	if idleTimeout > 0 {
		q += "; SET LOCAL idle_in_transaction_session_timeout = " + ms(idleTimeout)
	}
	return q
}

// Close implements Store.
func (s *store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.stopSweep != nil {
			s.stopSweep()
			<-s.sweepDone
		}
		if s.stopWatch != nil {
			s.stopWatch()
		}
		s.mu.Lock()
		txs := s.txs
		s.txs = make(map[txKey]*openTx)
		s.mu.Unlock()
		for _, o := range txs {
			if err := rollback(context.Background(), o.tx); err != nil {
				s.log.Warn("pgstore: close: rollback", "err", err)
			}
			o.done(errTxClosed)
		}
		s.watchers.Wait()
	})
	return nil
}

// Claim implements engine.Store. The claim of a new key is one statement
// and one round trip, an INSERT that does nothing when the key has a
// record; a claim that finds a record then reads it, in a second. While
// more than one claim in three finds a record, the Store reads the key
// first instead: a replay is one SELECT, which writes nothing, and a new
// key takes the INSERT after it. A claim that finds a record changes no row
// either way; when the INSERT comes first, it takes a value of the token
// sequence all the same, which PostgreSQL logs (in the WAL, with a
// transaction ID) once in 32 values.
// The takeover of an expired record or lease is the read and a conditional
// UPDATE, which returns the record's steps (engine.StepStore), as does a
// claim after a release.
//
// In transactional mode Claim begins the transaction that the lease is, and
// waits for a concurrent transaction that holds the same key for at most the
// lock timeout (WithLockTimeout), and for at most half the time that ctx
// has left: when that one commits, Claim returns its record, Completed; when
// it rolls back, Claim acquires; when the wait times out, Claim returns
// InFlight with RetryAfter set to the lock timeout and, since the other
// transaction's row cannot be read before it commits, the caller's own
// fingerprint.
func (s *store) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	if err := ctx.Err(); err != nil {
		return engine.Claim{}, fmt.Errorf("pgstore: claim: %w", err)
	}
	if s.closed.Load() {
		return engine.Claim{}, fmt.Errorf("pgstore: claim: %w", engine.ErrStoreClosed)
	}
	var (
		c   engine.Claim
		err error
	)
	if s.transactional {
		// A failure before the claim ran rolled the transaction back:
		// nothing was written, and the whole claim runs once more.
		err = s.retry(ctx, func() (err error) {
			c, err = s.claimTx(ctx, id, fingerprint, lease, ttl)
			return err
		})
	} else {
		err = s.retry(ctx, func() (err error) {
			c, _, err = s.claim(ctx, s.pool, id, fingerprint, lease, ttl)
			return err
		})
	}
	if err != nil && isReadOnly(err) {
		c, err = s.claimReadOnly(ctx, id, err)
	}
	if err != nil {
		return engine.Claim{}, fmt.Errorf("pgstore: claim: %w", err)
	}
	return c, nil
}

// claimReadOnly answers a Claim that a read-only server (a standby, or one
// set to default_transaction_read_only) refused with refused: a completed
// record is replayed and a live lease is in flight, which need no write; a
// request that would have to claim gets the refusal, a store failure.
func (s *store) claimReadOnly(ctx context.Context, id engine.ID, refused error) (engine.Claim, error) {
	r, found, err := s.lookup(ctx, id)
	switch {
	case err != nil:
		return engine.Claim{}, errors.Join(refused, err)
	case !found:
		return engine.Claim{}, refused
	}
	row := claimRow{state: r.state, fingerprint: r.fingerprint, live: r.live, remaining: r.remaining,
		status: r.status, headers: r.headers, body: r.body, bodyOmitted: r.bodyOmitted}
	if row.state != "completed" && !row.live {
		return engine.Claim{}, refused // a takeover would write
	}
	return row.claim()
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// claim runs insertSQL, which inserts a record when the key has none, and
// then, when it inserted nothing, readSQL; or, while most claims find a
// record, readSQL first and insertSQL for a key without one (see
// readFirst); then takeoverSQL when the record it found may be taken over;
// until one of them gives an answer.
func (s *store) claim(ctx context.Context, db querier, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, backend, error) {
	scope, key, fp := []byte(id.Scope), []byte(id.Key), []byte(fingerprint)
	// The record outlives the lease by the TTL: a holder lost at its
	// lease's end may have done its work then, and the retry must see it.
	leaseUS, ttlUS := micros(lease), micros(addDur(lease, ttl))
	h := s.recent.hash(id)
	again := s.claimPath == claimPathAdaptive && s.recent.has(h)
	for range maxClaimAttempts {
		q, mode := s.stmts(), s.hotMode()
		sized, readFirst := s.sizeDue(), again || s.readFirst()
		var (
			r                          claimRow
			inserted                   bool
			size                       int64
			b                          backend
			leaseUntil, expiresAt, now time.Time
			err                        error
		)
		insert := func() error {
			insertSQL := q.insert
			if sized {
				insertSQL = q.insertSized
			}
			row := db.QueryRow(ctx, insertSQL, mode, scope, key, fp, leaseUS, ttlUS)
			var err error
			if s.transactional {
				err = row.Scan(&r.token, &size, &b.pid, &b.start)
			} else {
				err = row.Scan(&r.token, &size)
			}
			inserted = err == nil
			return err
		}
		read := func() error {
			readSQL := q.read
			if sized {
				readSQL = q.readSized
			}
			row := db.QueryRow(ctx, readSQL, mode, scope, key)
			if s.transactional {
				return row.Scan(&inserted, &r.token, &r.state, (*stringScanner)(&r.fingerprint), &leaseUntil, &expiresAt,
					&r.status, &r.headers, &r.body, &r.bodyOmitted, &now, &size, &b.pid, &b.start)
			}
			return row.Scan(&inserted, &r.token, &r.state, (*stringScanner)(&r.fingerprint), &leaseUntil, &expiresAt,
				&r.status, &r.headers, &r.body, &r.bodyOmitted, &now, &size)
		}
		if readFirst {
			if err = read(); errors.Is(err, pgx.ErrNoRows) {
				err = insert()
			}
		} else {
			if err = insert(); errors.Is(err, pgx.ErrNoRows) {
				err = read()
			}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			continue // a concurrent claimer's record, committed since the statement's snapshot
		}
		if err != nil {
			return engine.Claim{}, backend{}, err
		}
		if !again {
			s.saw(!inserted)
		}
		s.recent.add(h)
		s.observeSize(size)
		if inserted {
			return engine.Claim{Status: engine.Acquired, Token: engine.Token(r.token)}, b, nil
		}
		r.live = leaseUntil.After(now)
		r.remaining = leaseUntil.Sub(now).Microseconds()
		r.expired = !expiresAt.After(now)
		if !r.mayTakeOver(fingerprint) {
			c, err := r.claim()
			return c, b, err
		}
		var (
			token     int64
			abandoned int32
			stepEls   [][]byte
		)
		row := db.QueryRow(ctx, q.takeover, mode, scope, key, r.token, fp, leaseUS, ttlUS)
		if s.transactional {
			err = row.Scan(&token, &abandoned, &stepEls, &b.pid, &b.start)
		} else {
			err = row.Scan(&token, &abandoned, &stepEls)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			continue // changed since it was read: look again
		}
		if err != nil {
			return engine.Claim{}, backend{}, err
		}
		steps, err := decodeSteps(stepEls)
		if err != nil {
			// A store failure: in lease mode the new lease runs out
			// unused, and each retry fails so, until an operator
			// settles the record (Resolve).
			return engine.Claim{}, backend{}, err
		}
		return engine.Claim{Status: engine.Acquired, Token: engine.Token(token), Abandoned: int(abandoned), Steps: steps}, b, nil
	}
	return engine.Claim{}, backend{}, errContended
}

// How a claim goes. A claim of a new key is insertSQL alone, one round
// trip and the least the backend can do for it (an INSERT … ON CONFLICT DO
// NOTHING, as the minimal statements'); a claim of a key with a record is
// that INSERT, which inserts nothing, and readSQL, two round trips. A
// Store that reads first instead answers a claim of a key with a record in
// one SELECT, and takes insertSQL after it for a new key. An INSERT that
// finds a record costs the backend several times a SELECT of the row (its
// executor's set-up, the conflict check, and a value of the token
// sequence, which it takes before it finds the conflict), a SELECT that
// finds nothing little: so a Store reads first while more than one claim
// in three finds a record (a burst of retries, a client that replays), and
// inserts first otherwise, as most claims are of new keys. found rises by
// foundHit for a claim that found a record, falls by foundNew for one that
// inserted, within ±foundBound, and the Store reads first while it is
// above 0. Either way the answer is the same; only its cost differs. The
// bound is how long a change of traffic takes to change the path: after a
// run of new keys, five claims that find a record; after a run of
// replays, nine new keys, each of which takes two round trips until then.
// A claim of a key that this Store claimed moments ago (a retry that came
// back here) reads first whatever found says, and leaves found as it is
// (see recentKeys).
// (An earlier version read the key and inserted in one statement, a CTE:
// one round trip either way, but a new key's claim cost the backend about
// 1.5 times the INSERT alone, BenchmarkBackendCPURatio's first/minimal
// 1.25-1.30 against 1.05 now.)
const (
	foundHit   = 2
	foundNew   = 1
	foundBound = 8
)

// claimPath fixes how a claim reads the key, for tests: the zero value
// lets found decide.
type claimPath int32

const (
	claimPathAdaptive claimPath = iota
	claimPathInsertFirst
	claimPathReadFirst
)

// readFirst reports whether a claim is to read the key in readSQL before
// it inserts, rather than after an INSERT that inserted nothing.
func (s *store) readFirst() bool {
	switch s.claimPath {
	case claimPathInsertFirst:
		return false
	case claimPathReadFirst:
		return true
	}
	return s.found.Load() > 0
}

// saw weighs a claim that found a record, or inserted one, in found.
func (s *store) saw(found bool) {
	for {
		n := s.found.Load()
		next := n - foundNew
		if found {
			next = n + foundHit
		}
		next = min(max(next, -foundBound), foundBound)
		if next == n || s.found.CompareAndSwap(n, next) {
			return
		}
	}
}

// claimRow is a record that Claim found.
type claimRow struct {
	token       int64
	state       string
	fingerprint string
	live        bool  // the lease has not ended
	remaining   int64 // µs left of the lease
	expired     bool  // the record has expired
	status      int32
	headers     []byte
	body        []byte
	bodyOmitted bool
}

// mayTakeOver reports whether the record Claim found is to be replaced by a
// new lease: it expired, or it is in flight, its lease ended and it is for
// the same request.
func (r *claimRow) mayTakeOver(fingerprint string) bool {
	return r.expired || (r.state == "in_flight" && !r.live && r.fingerprint == fingerprint)
}

func (r *claimRow) claim() (engine.Claim, error) {
	switch {
	case r.state == "completed":
		h, err := sqlrecord.DecodeHeader(r.headers)
		if err != nil {
			return engine.Claim{}, err
		}
		return engine.Claim{
			Status:      engine.Completed,
			Fingerprint: r.fingerprint,
			Response:    &engine.Response{Status: int(r.status), Header: h, Body: r.body, BodyOmitted: r.bodyOmitted},
		}, nil
	case r.live:
		return engine.Claim{
			Status:      engine.InFlight,
			Fingerprint: r.fingerprint,
			RetryAfter:  max(fromMicros(r.remaining), time.Microsecond),
		}, nil
	default: // a lease that ended, for another request
		return engine.Claim{Status: engine.InFlight, Fingerprint: r.fingerprint}, nil
	}
}

// Complete implements engine.Store; the response replaces the record's
// steps. In lease mode it is one statement, and
// a response that can never be stored (README.md lists what) fails with an
// error wrapping engine.ErrNotStorable and changes nothing; transactional
// mode stores such a response without its body and commits.
//
// In transactional mode it stores the response in the lease's transaction
// and commits it, with the handler's writes: two round trips. When the
// transaction cannot commit (a statement of the handler failed, its
// connection was lost, the server ended it), Complete rolls it back and
// returns an error that wraps ErrRolledBack: nothing the handler wrote was
// kept, and the next Claim of the key acquires it. When the connection fails
// during COMMIT itself, the outcome is unknown and the error wraps neither
// ErrRolledBack nor engine.ErrLeaseLost: the next Claim finds either the
// completed record or none, never half of it. Every error of Complete in
// transactional mode wraps engine.ErrNotCommitted, on which the middleware
// answers 503 instead of the handler's response.
func (s *store) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	if resp == nil {
		return errors.New("pgstore: complete: nil response")
	}
	if s.transactional {
		if err := s.completeTx(ctx, id, token, resp, ttl); err != nil {
			return notCommitted{err}
		}
		return nil
	}
	headers := sqlrecord.EncodeHeader(resp.Header)
	if err := storable(id, resp, headers); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	var tag pgconn.CommandTag
	err := s.retry(ctx, func() (err error) {
		tag, err = s.pool.Exec(ctx, s.stmts().complete, s.hotMode(), []byte(id.Scope), []byte(id.Key), int64(token),
			micros(ttl), int32(resp.Status), headers, resp.Body, resp.BodyOmitted)
		return err
	})
	if isNotStorable(err) {
		return fmt.Errorf("pgstore: complete: %w: %w", engine.ErrNotStorable, err)
	}
	return result("complete", tag, err)
}

// Release implements engine.Store, in one statement. In lease mode it
// deletes a record that the holder's Claim created, unless it holds steps;
// one that the Claim took over from lost holders, or that holds steps, goes
// back to how the Claim found it, with a new token and its steps: in
// flight, its lease ended, one holder fewer counted, which the next
// takeover counts again (a table shared with an earlier release of the
// package reads it as it reads any lost holder's). In transactional mode it
// rolls the lease's transaction back, the handler's writes with it, and the
// claim with them, which leaves the record as the Claim found it too.
func (s *store) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if s.transactional {
		return s.releaseTx(ctx, id, token)
	}
	var n int64
	err := s.retry(ctx, func() error {
		return s.pool.QueryRow(ctx, s.stmts().release, s.hotMode(), []byte(id.Scope), []byte(id.Key), int64(token)).Scan(&n)
	})
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("pgstore: release: %w", engine.ErrLeaseLost)
	}
	return nil
}

// Extend implements engine.Store. In lease mode it is one statement.
//
// In transactional mode it changes nothing, and succeeds while the lease's
// transaction is open: no other claimer can take the record over, since the
// row lock that the transaction holds, not the lease's end, protects it, and
// if the process dies PostgreSQL rolls the transaction back. It must not
// touch the transaction, which the handler may be using at the same moment:
// it asks the server, in one statement on another connection of the pool,
// whether the transaction's backend is still in it, and fails with an error
// wrapping engine.ErrLeaseLost once the server has ended the transaction
// (its idle timeout, an operator, a broken connection), which released the
// key to the next request.
func (s *store) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	if s.transactional {
		return s.extendTx(ctx, id, token)
	}
	var tag pgconn.CommandTag
	err := s.retry(ctx, func() (err error) {
		tag, err = s.pool.Exec(ctx, s.stmts().extend, s.hotMode(), []byte(id.Scope), []byte(id.Key), int64(token), micros(lease))
		return err
	})
	return result("extend", tag, err)
}

// result turns the outcome of a statement conditional on the token into
// Complete's, Release's or Extend's.
func result(op string, tag pgconn.CommandTag, err error) error {
	if err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %s: %w", op, engine.ErrLeaseLost)
	}
	return nil
}

// addDur is a + b for durations that are not negative, saturated at the
// longest duration.
func addDur(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// micros converts a duration to the microseconds the statements take. Every
// duration fits: math.MaxInt64 nanoseconds is 292 years, and PostgreSQL's
// timestamps reach the year 294276.
func micros(d time.Duration) int64 { return d.Microseconds() }

// fromMicros converts microseconds that PostgreSQL computed back to a
// duration, saturating, in case the statements' floating-point interval
// arithmetic rounds a lease of math.MaxInt64 up.
func fromMicros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// stringScanner scans bytea into a string with a single copy.
type stringScanner string

func (s *stringScanner) ScanBytes(b []byte) error {
	*s = stringScanner(b)
	return nil
}
