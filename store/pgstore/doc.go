// Package pgstore is an engine.Store (engine.Store) in PostgreSQL, on pgx v5, for an API that
// runs as several instances: they share one table, and one atomic statement
// decides which of several concurrent requests with the same key runs.
//
// Give [New] the application's own pool (never a connection string), create
// the table with [Store.Migrate], or with [Schema] in your own migrations,
// and hand the Store to [server.New]. A Store is safe for concurrent use.
//
//	store, err := pgstore.New(pool)          // *pgxpool.Pool
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... }
//	mw, err := server.New(store)
//
// Every time the Store compares or stores comes from the database's clock
// (statement_timestamp()), never from the instances': machines whose clocks
// disagree still agree on when a lease or a record ends.
//
// # Lease mode
//
// By default each operation is a statement or two, each committed at
// once. The Claim of a new key is one INSERT … ON CONFLICT DO NOTHING of
// the record in flight, with a lease and a fencing token; the middleware
// runs the handler, renewing the lease with Extend; Complete stores the
// response: two round trips, as the least pair of statements that do the
// job. A Claim that finds a record then reads it in a SELECT. While more
// than one claim in three finds a record (a burst of retries), the Store
// reads first instead: a replay (Claim of a completed key) is one SELECT,
// which writes nothing (no WAL, no commit flush), and a new key's record is
// inserted in a second statement. A retry of a key that this Store claimed
// moments ago reads first in any case.
//
// The handler's effects and the stored response are two separate commits,
// and this is the weaker guarantee: if the process dies, or loses the
// database, after the handler's effect and before Complete, the record stays
// in flight until its lease ends, after which a retry takes it over and runs
// the handler again. The fencing token that the middleware hands the
// handler lets a downstream system refuse the older holder's writes, but the
// effect itself happened twice unless it is idempotent on its own. When the
// handler's effects live in the same database, transactional mode closes
// that gap.
//
// A Claim that takes over a lease whose holder never completed or released
// it (it died, hung, or lost the database) reports how many holders were
// lost before it, in engine.Claim.Abandoned: the handler may find its own
// effect already done. [Store.Lookup] and [Store.Resolve] (engine.Inspector)
// let an operator see such a record and settle it by hand. A response that
// PostgreSQL can never store (over a gigabyte, or refused for one of its
// limits) fails Complete with an error wrapping engine.ErrNotStorable, on
// which the middleware records the request as done without its body.
//
// # Steps
//
// The Store keeps the steps of a call (engine.StepStore; package step runs
// them) in the call's record: its steps column holds one element per step,
// and is NULL when there are none. A Claim that takes a record over, after
// a lost holder or after a release, returns the steps from the UPDATE that
// it runs anyway; the Claim of a new key and a replay run the statements
// they ran before steps, and read none. [Store.SaveStep] is one statement
// and one round trip: an UPDATE, fenced by the lease's token, that merges
// the step into the column, replacing the step of the same name. It
// rewrites the column, so its cost grows with the steps the record holds:
// a step of a few hundred bytes costs about what a Complete does, and one
// beside 99 others of 64 KiB (the most steps, 100, of the most bytes, 64 KiB; 6.4
// MiB) a fraction of a second (README.md, Steps, has the measurements). A Release keeps a record that holds steps,
// for the retry; Complete and Resolve drop the steps; they expire, and are
// swept, with their record.
//
// [RunStep] runs a step whose effects are rows of the Store's database in
// one transaction with the step's record: BEGIN, the step's statements,
// the UPDATE that records it (SaveStep's, last, so that the record's row is
// locked only until the COMMIT), COMMIT. Its writes and its record commit
// together or not at all, so that the step runs exactly once per key even
// when the process dies in the middle of it: the retry finds the step done,
// with its writes, or finds neither, and runs it. It costs three round
// trips besides the step's own, where package step's Run costs one (two
// under engine.RefuseAbandoned, which records each step's start: RunStep
// needs no start). Only the answer to the COMMIT lost on the way (a broken
// connection) leaves the outcome unknown, and only to the run that sent it:
// its retry knows.
//
// # Transactional mode
//
// With [WithTransactions], the claim, the handler's own writes and the stored
// response commit in one transaction, or not at all. Claim begins the
// transaction and inserts the claim in it; the middleware runs the handler
// with the context that Bind returns; the handler takes the transaction with
// [TxFromContext] and writes in it; Complete stores the response in it and
// commits; Release rolls it back. A 5xx, a panic, a statement that failed, a
// cancelled statement, a lost connection, a crash: in every case the
// business writes and the claim are rolled back together, and a retry finds
// the key free and nothing half done.
//
// A duplicate that arrives while the original runs cannot see the
// uncommitted record: its Claim waits on the row's lock for at most the lock
// timeout (WithLockTimeout). When the original commits, the duplicate gets
// Completed and replays it; when the original rolls back, the duplicate
// acquires; when the wait times out, the duplicate gets InFlight (409), with
// RetryAfter set to the lock timeout and its own fingerprint, since the
// original's cannot be read yet: a key reused for another request is told
// 409 while the original runs, and 422 once it has committed.
//
// Claim.Abandoned is 0 in this mode: a holder that is lost has its
// transaction rolled back, its writes with it, and the record is gone.
// Steps too are written in the transaction: SaveStep in it, RunStep in a
// savepoint of it; they commit with the response, or are rolled back with
// the call, and the retry runs them again.
//
// Extend changes nothing in this mode, and succeeds while the transaction is
// open: the row lock, not a lease, protects the record, nobody can take it
// over, and if the process dies PostgreSQL rolls the transaction back. A
// transaction can also end while its handler runs: the server ends one left
// idle longer than the idle timeout (WithIdleTimeout), as it does one whose
// backend an operator terminates or whose connection breaks, and the next
// request with the key then runs. The Store watches for it: the context that
// Bind returned is cancelled, with a cause wrapping engine.ErrLeaseLost,
// within a quarter of the idle timeout (between 25 ms and a second), and
// Extend fails with engine.ErrLeaseLost. A handler must look at its context
// before an effect outside the database, as under any lease.
//
// Transactional mode asks more of the application (a pool sized for a
// connection per request, a pgx setting for cancelled statements, one mode
// per table): README.md in this package's directory lists it, with the
// schema (Schema returns the SQL; Migrate applies it under an advisory
// lock), the sweep of expired records (Sweep, or WithSweeper's background
// sweeper, stopped by Close), the queries that report how many records the
// table holds and how many bytes they take (for metrics, such as the
// function given to idemotel.RegisterStoreSize), what errors mean, and,
// under "Operating it", what to set on the server and in front of it
// (poolers, timeouts, read-only servers, plans). In short: errors start with "pgstore:", an error
// wrapping engine.ErrLeaseLost means the token is not the record's current
// one, one wrapping engine.ErrNotStorable that the response, or the step,
// can never be stored, and every other error is a store failure, which the middleware
// answers with 503.
package pgstore
