// Package mysqlstore is an engine.Store in one MySQL or MariaDB table, on
// github.com/go-sql-driver/mysql, for an API that runs as several instances
// on MySQL, MariaDB, or a server that speaks their protocol.
//
// Give New the application's own *sql.DB (never a DSN), create the table
// with Store.Migrate, and hand the Store to a door. A Store is safe for
// concurrent use.
//
//	db, err := sql.Open("mysql", "app@tcp(db:3306)/app")
//	store, err := mysqlstore.New(db)
//	if err := store.Migrate(ctx); err != nil { ... }
//	mw, err := server.New(store)
//
// Every time the Store compares or stores comes from the server's clock
// (UTC_TIMESTAMP(6), in microseconds), never from the instances'.
//
// # The claim
//
// A Claim reads the record first, with a consistent read that takes no
// lock: a replay, or a request in flight, is answered by that read alone,
// and writes nothing. Otherwise the claim and the takeover are one
// statement, INSERT … ON DUPLICATE KEY UPDATE, every assignment conditional
// on the row being the one the read saw (a version that every change of the
// row moves): it inserts the record in flight, or takes over in place a
// record that expired, or whose lease expired with the same fingerprint,
// counting the lost holder in Claim.Abandoned. The statement's insert ID
// (LAST_INSERT_ID(expr)) is the new token, or 0 when the row was not the one
// read, and its affected rows are 1 for an insert and 2 for a takeover; the
// answer is the same whether or not the connection sets clientFoundRows
// (which reports an unchanged row as 1 affected row rather than 0). No
// INSERT IGNORE: it turns other errors into warnings. Complete, Release and
// Extend are one statement each, conditional on the token. A sweeper
// deletes, every minute, records expired more than a second ago, in batches
// of a thousand, until Close.
//
// # Versions
//
// The statements need MySQL 8.0 or later, or MariaDB 10.3 or later (10.2.4
// persists the tables' counters, 10.3 is the oldest still maintained;
// tested on MariaDB 10.11), with InnoDB. The claim's UPDATE clause names
// its parameters again (ON DUPLICATE KEY UPDATE fingerprint = IF(…,
// CAST(? AS BINARY), …)), which every version accepts: not
// VALUES(fingerprint), which MySQL deprecates from 8.0.20 and warns about,
// nor a row alias (VALUES (…) AS new), which MySQL added in 8.0.19 and
// MariaDB lacks, nor a derived table of the parameters, which costs a
// temporary table at every claim. MySQL (and MariaDB by default) evaluates
// the assignments of an UPDATE left to right, each seeing the ones before;
// the claim's condition reads only the version, assigned last, so that it
// holds with MariaDB's SIMULTANEOUS_ASSIGNMENT mode too. Use ROW or MIXED
// binary logging, the default since MySQL 5.7.7: the claim reads the
// server's clock and sets LAST_INSERT_ID, which row-based logging
// replicates as the row it wrote.
//
// Tokens are the server's clock in microseconds times 1024 for a new record,
// and, for a takeover, one more than the row's, or that, whichever is
// larger: a Release or an operator's forgetting makes the row expire and
// keeps it, so a key's tokens only grow while its row exists, and after the
// sweep deleted it as long as the server's clock did not go back by more than
// a second.
//
// Scope and key are kept as binary strings of at most 1024 bytes each; a
// response is kept whole up to the server's max_allowed_packet (16 MiB on
// MariaDB, 64 MiB on MySQL 8 by default): a larger one fails Complete with
// an error wrapping engine.ErrNotStorable, on which the engine records the
// request as done without its body.
//
// # Steps
//
// The Store is an engine.StepStore (package step). A call's steps are kept
// in its record's row, in one LONGBLOB column: a log of entries (a step's
// name, fingerprint and result), in which the last entry of a name is the
// step. A step is one statement, one round trip: an UPDATE that appends
// its entry to the log with CONCAT, conditional on the token, on the log
// having fewer than stepLimits.MaxSteps entries, and on its staying 256 KiB
// under the server's max_allowed_packet (past it CONCAT fails, or, outside
// strict mode, returns NULL with a mere warning, which would drop every
// step). A step of 256 bytes took 0.35 to 1 ms, where a first execution
// took 0.8 to 2.2 ms (BenchmarkSteps, on a loaded machine of two cores).
// InnoDB writes the column whole, so a step writes the steps before it
// again: nothing much for small results, and about 3 s for the 100 steps of
// 64 KiB that a record takes at most (stepLimits.MaxSteps of
// stepLimits.MaxSize, 6.5 MB in one row).
//
// A replaced step is one more entry of the log. The step that would take
// the log past stepLimits.MaxSteps entries, or past the packet, and the removal
// of a step, rewrite the log compacted, one entry per step, in a short
// transaction (BEGIN, SELECT … FOR UPDATE, UPDATE, COMMIT): MySQL has no
// function that reads the log, for one statement to decide from it. A step
// that would take the compacted log past max_allowed_packet less 256 KiB is
// refused with an error wrapping engine.ErrNotStorable, and the steps kept
// stay: the default packet (16 MiB on MariaDB, 64 MiB on MySQL 8) holds
// the most a record takes; one under 6.5 MiB holds fewer steps of 64 KiB
// (11 in 1 MiB).
//
// A Claim's read carries the steps of a record that it may take over (in
// flight, its lease over), and the claim changes the row only if it is
// still the one read: a takeover, or the claim after a release, costs no
// statement more, and the claim of a new key, a replay and a request in
// flight read no steps. A Release keeps a record that holds steps, in
// flight with its lease over (see engine.StepStore); Complete and Resolve
// drop the steps, and the sweeper deletes them with their record.
//
// Migrate adds the columns of steps (steps and step_count, at the end) to
// a table made by an earlier version: ALTER TABLE … ADD COLUMN, which MySQL
// 8.0.12 and later and MariaDB 10.3 and later do at once, without copying
// the table. It waits for the table's metadata lock, which every
// transaction open on the table holds (those of transactional mode among
// them), and statements on the table wait behind it: run it when no long
// transaction holds the table. Instances that run it at once add each
// column once, and instances of an earlier version go on using the table.
//
// # Transactional mode
//
// With WithTransactions, the claim, the handler's own writes and the stored
// response commit in one transaction (READ COMMITTED), or not at all. Claim
// begins the transaction and claims in it; the handler takes the
// transaction with TxFromContext and writes in it; Complete stores the
// response in it and commits; Release rolls it back. A 5xx, a panic, a lost
// connection, a crash: in every case the writes and the claim roll back
// together, and a retry finds the key free.
//
// A duplicate that arrives while the original runs cannot see the
// uncommitted record: its Claim waits for the row's lock for at most a
// second (innodb_lock_wait_timeout, set on the transaction's connection and
// put back when it ends). When the original commits, the duplicate replays
// it; when it rolls back, the duplicate acquires; when the wait times out,
// the duplicate gets InFlight (409) with RetryAfter a second and its own
// fingerprint. Claim.Abandoned is 0 in this mode, and Extend succeeds while
// the transaction is open. The pool needs a connection per request in
// flight. A step (package step) is written in the lease's transaction, the
// one TxFromContext returns, whatever the context SaveStep is given:
// another connection would wait for the row's lock. It commits with the
// response, which drops it, or rolls back with the claim, so that a retry
// after a Release runs every step again, as it runs every write of the
// handler again.
//
// # Errors
//
// Errors start with "mysqlstore:". One wrapping engine.ErrLeaseLost means
// the token is not the record's current one; engine.ErrNotStorable, a
// response the server will never take, or a step over stepLimits.MaxSize,
// past stepLimits.MaxSteps or past max_allowed_packet; engine.ErrNotCommitted, a Complete
// of transactional mode that did not commit. Every other error is a store
// failure, which the engine answers with 503.
package mysqlstore
