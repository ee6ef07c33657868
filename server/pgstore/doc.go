// Package pgstore is a server.Store in PostgreSQL, on pgx v5, for an API that
// runs as several instances: they share one table, and one atomic statement
// decides which of several concurrent requests with the same key runs.
//
// Give New the application's own pool (never a connection string), create
// the table with Migrate, or with Schema in your own migrations, and hand the
// Store to the middleware. A Store is safe for concurrent use.
//
// Every time the Store compares or stores comes from the database's clock
// (statement_timestamp()), never from the instances': machines whose clocks
// disagree still agree on when a lease or a record ends.
//
// # Lease mode
//
// By default each operation is one statement, committed at once, and one
// round trip. Claim inserts the record in flight, with a lease and a fencing
// token; the middleware runs the handler, renewing the lease with Extend;
// Complete stores the response. A replay (Claim of a completed key) reads
// one row and writes nothing: no WAL, no commit flush.
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
// # Transactional mode
//
// With WithTransactions, the claim, the handler's own writes and the stored
// response commit in one transaction, or not at all. Claim begins the
// transaction and inserts the claim in it; the middleware runs the handler
// with the context that Bind returns; the handler takes the transaction with
// TxFromContext and writes in it; Complete stores the response in it and
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
// Extend does nothing in this mode, and succeeds while the transaction is
// open: the row lock, not a lease, protects the record, nobody can take it
// over, and if the process dies PostgreSQL rolls the transaction back.
//
// What the middleware, and anyone calling the Store directly, must know:
//   - Send the handler's response only after Complete has returned nil. An
//     error from Complete means the handler's writes were rolled back
//     (ErrRolledBack) or, when the connection failed during COMMIT, that
//     nobody knows; either way the client must retry, and the retry either
//     replays the committed record or runs afresh.
//   - Each request being served holds a connection of the pool, and a
//     PostgreSQL backend, from Claim to Complete or Release; each waiting
//     duplicate holds another, for up to the lock timeout. Size the pool for
//     it.
//   - The transaction is the handler's only for the statements it runs with
//     TxFromContext: a statement cancelled by its context breaks the
//     connection, and so the transaction. pgx ends such a statement by
//     closing its connection, which PostgreSQL notices only when the
//     statement ends, holding the row lock (and answering duplicates 409)
//     until then: set client_connection_check_interval (for example 100ms,
//     in the pool's RuntimeParams) so that it notices sooner, or give pgx
//     a CancelRequestContextWatcherHandler. A transaction left idle longer than
//     the idle timeout (WithIdleTimeout) has its session ended by the server.
//     Close rolls back what is still open.
//   - Do not share a table between stores in different modes: a lease-mode
//     Claim on a key that a transaction holds waits for it with no lock
//     timeout.
//
// A claim costs two round trips in this mode (BEGIN with its settings, then
// the claim), a completion two (the response, COMMIT), and a replay three.
//
// # Schema
//
// Migrate applies the SQL below, with the table's name in place of
// idempotency_records (see WithTable). It is idempotent, and safe when
// several instances start at once: it runs in one transaction that holds a
// transaction-level advisory lock, MigrateLockKey. When everything exists it
// takes no lock on the table. A team that runs its own migrations applies
// the SQL that Schema returns, once.
//
//	-- Idempotency records of github.com/idemkit/idempotency/server/pgstore; its
//	-- package documentation describes every column. Every statement is idempotent.
//
//	-- Fencing tokens. CACHE 1 (the default) matters: with a larger cache each
//	-- session would hand out its own range, and a later lease could get a
//	-- smaller token than an earlier one.
//	CREATE SEQUENCE IF NOT EXISTS "idempotency_records_token_seq" AS bigint CACHE 1;
//
//	CREATE TABLE IF NOT EXISTS "idempotency_records" (
//	    scope        bytea       NOT NULL,
//	    key          bytea       NOT NULL,
//	    fingerprint  bytea       NOT NULL,
//	    state        text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
//	    token        bigint      NOT NULL,
//	    lease_until  timestamptz NOT NULL,
//	    created_at   timestamptz NOT NULL,
//	    expires_at   timestamptz NOT NULL,
//	    status       integer,
//	    headers      bytea,
//	    body         bytea,
//	    body_omitted boolean     NOT NULL DEFAULT false,
//	    PRIMARY KEY (scope, key)
//	);
//
//	-- Dropping the table drops its token sequence too.
//	ALTER SEQUENCE "idempotency_records_token_seq" OWNED BY "idempotency_records".token;
//
//	-- Serves the sweep of expired records.
//	CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at_idx" ON "idempotency_records" (expires_at);
//
// The columns:
//   - scope, key: the record's server.ID. They are bytea because a Go string
//     is any bytes, and text refuses NUL and invalid UTF-8; read them with
//     convert_from(key, 'UTF8').
//   - fingerprint: the request's fingerprint, as the middleware computed it.
//   - state: 'in_flight' while a handler runs, 'completed' once its
//     response is stored.
//   - token: the fencing token of the current lease, from the table's
//     sequence, so that it grows across releases (which delete the row),
//     takeovers and expiry.
//   - lease_until: when the lease ends; a record in flight past it may be
//     taken over by a Claim with the same fingerprint.
//   - created_at, expires_at: when the record was created, and when it
//     stops counting (its time to live). An expired record is treated as
//     absent by every operation, swept or not.
//   - status, headers, body, body_omitted: the stored response. headers is
//     a compact binary encoding of the package's own (names sorted, every
//     value in order, every byte kept); jsonb could not hold every byte a
//     header may carry.
//
// # Sweep
//
// Expired records are deleted by Sweep, in batches of bounded size, each one
// short statement that locks only the rows it deletes and skips rows that
// others hold; or by the background sweeper that WithSweeper starts in an
// instance, and Close stops. Sweeping is housekeeping only: a Claim treats
// an expired record as absent whether or not it was swept. A sweep never
// makes a Claim wait, but it competes with claims for CPU and for WAL
// bandwidth, so prefer one sweeper (or a scheduled job) for all instances.
//
// # Monitoring
//
// What the middleware did with each request it tells its observer
// (server.WithObserver). How many records the table holds, and how many
// bytes they take, is a query, to run when the metrics are collected (from
// an idemotel.StoreSize, for example), not by a poller of its own; and on
// one instance, since the instances share the table. With the table's name
// in place of idempotency_records:
//
//	SELECT count(*) FILTER (WHERE expires_at > statement_timestamp()) AS records,
//	       count(*) FILTER (WHERE expires_at > statement_timestamp() AND state = 'in_flight') AS in_flight,
//	       pg_total_relation_size('idempotency_records'::regclass) AS bytes
//	FROM idempotency_records;
//
// records leaves out the expired records that the sweep has not deleted
// yet; in_flight counts the requests running (or whose holder died, until
// their lease ends); bytes is the table's size on disk with its index and
// TOAST, expired and dead rows included. The count reads the whole table.
// On a large one, PostgreSQL's own estimate costs nothing:
//
//	SELECT reltuples::bigint AS records, pg_total_relation_size(oid) AS bytes
//	FROM pg_class WHERE oid = 'idempotency_records'::regclass;
//
// It counts expired rows too, and is as recent as the table's last VACUUM
// or ANALYZE, which autovacuum runs as the table changes; it is -1 before
// the first.
//
// # Errors and the pool
//
// Errors carry the prefix "pgstore:" and wrap their cause. Complete, Release
// and Extend return an error wrapping server.ErrLeaseLost when the token is
// not the record's current one; every other error, a PostgreSQL outage
// included, is a store failure, which the middleware answers with 503 and
// without running the handler. Errors never carry the connection string.
//
// pgx prepares each statement once per connection (its default query
// execution mode); measured on PostgreSQL 15, a replay takes a quarter of the
// time it takes unprepared. pgxpool keeps connecting in the background for
// up to two minutes by default after the caller gave up, so set a connect
// timeout in the pool's configuration that fits the API's own deadlines. The
// Store expects the READ COMMITTED isolation level, PostgreSQL's default, for
// its single statements; it sets it itself on its transactions.
package pgstore
