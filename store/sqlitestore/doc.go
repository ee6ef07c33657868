// Package sqlitestore is an engine.Store in one SQLite file, on a pure-Go
// driver (modernc.org/sqlite: no cgo), for a service on one machine whose
// records must survive its restart: a deploy, a crash, a SIGKILL. memstore
// forgets every record when its process ends; this store does not.
//
//	store, err := sqlitestore.Open(ctx, "/var/lib/orders/idempotency.db")
//	if err != nil { ... }
//	defer store.Close()
//	mw, err := server.New(store)
//
// # The file
//
// Open opens the file in WAL mode, so that readers never wait for the
// writer, and creates the table idempotency_records in it if it is missing.
// Every time the Store compares or stores comes from the machine's clock, in
// microseconds. Tokens are the table's rowids, which SQLite hands out in
// increasing order while the row with the largest stays, and the Store
// never deletes that one: a token is larger than every one given before
// for its key, after a release or a sweep too.
//
// A Claim reads the record first, without a lock: a replay, or a request in
// flight, is answered by that read alone, and writes nothing. Otherwise the
// claim is one statement (INSERT … ON CONFLICT DO UPDATE … WHERE …
// RETURNING): it inserts the record in flight, or takes over in place a
// record that expired, or whose lease expired with the same fingerprint,
// counting the lost holder in Claim.Abandoned; a record that is neither is
// left alone, and Claim reads again. Complete, Release and Extend are one
// statement each, conditional on the token (a Complete after the lease
// ended, two). A sweeper deletes expired records every minute, in batches
// of a thousand, until Close; a record completed within its lease is
// deleted at most a lease after it expired, so that its Complete writes no
// index (see BENCHMARKS.md).
//
// # Steps
//
// The Store is an engine.StepStore (package step). A call's steps are kept
// in its record's row, in one BLOB column: a log of entries (a step's name,
// fingerprint and result), in which the last entry of a name is the step.
// A step is one statement in this process's turn to write, an UPDATE that
// appends its entry to the log, conditional on the token, and so one write
// transaction (with WithFullSync, one fsync): a step of 256 bytes took 40
// to 90 µs with synchronous NORMAL and 260 to 400 µs with FULL, where a
// first execution took 150 to 240 µs and 570 to 920 µs (BenchmarkSteps,
// on a loaded machine of two cores). SQLite writes a value whole, so a step writes the steps
// before it again: nothing much for small results, and about 8 s for the
// 100 steps of 64 KiB that a record takes at most (stepLimits.MaxSteps of
// stepLimits.MaxSize, 6.5 MB in one row), the last ones over 100 ms each.
//
// A replaced step is one more entry of the log. The step that would take
// the log past stepLimits.MaxSteps entries, and the removal of a step, rewrite
// the log compacted, one entry per step, in a short write transaction (a
// read and a write under BEGIN IMMEDIATE): SQLite has no function that
// reads the log, for one statement to decide from it.
//
// The claim's statement returns the steps of the record it takes over
// (RETURNING): a takeover, or the claim after a release, costs nothing
// more, and the claim of a new key, a replay and a request in flight read
// no steps. A Release keeps a record that holds steps, in flight with its
// lease over (see engine.StepStore); Complete and Resolve drop the steps,
// and the sweeper deletes them with their record.
//
// Open adds the columns of steps to a table made by an earlier version, in
// a write transaction, so that processes opening the file at once add
// them once; processes of an earlier version go on using the table.
//
// # Durability: synchronous NORMAL or FULL
//
// By default the file runs with synchronous=NORMAL, which in WAL mode does
// not wait for the disk at each commit: a committed record survives the
// process's crash, kill (SIGKILL) or restart, since the operating system
// holds what the process wrote; a power loss or an operating system crash
// can lose the last commits before it (the file stays consistent: each lost
// transaction is lost whole). WithFullSync sets synchronous=FULL: each
// commit waits for an fsync of the WAL, and survives a power loss too, at
// the cost of an fsync per Claim and per Complete (about 2 ms each on a disk
// without a write cache that survives power loss; see BENCHMARKS.md).
//
// NORMAL is the default because the restart that every service meets, and
// that this store exists for, is its process's: a deploy, a crash, an OOM
// kill. A power loss that rolls back the last records is the rarer event,
// and in transactional mode it rolls back the handler's writes with them,
// so nothing runs twice. In lease mode, whose handler's effects commit
// elsewhere (another database, a payment provider), a record lost to a power
// loss after its effect lets a retry run it again: set WithFullSync there.
//
// # Several processes
//
// Several processes may open the same file (on a local disk: SQLite's
// locks do not work over a network file system): SQLite admits one writer
// at a time, and every statement that writes waits for the file's write
// lock, for at most its context (the engine's store timeout). Within a
// process the Store's writers queue in order. Claim's one-statement write
// decides atomically across processes: two processes never both acquire a
// key.
//
// # Transactional mode
//
// With WithTransactions, the claim, the handler's own writes in the same
// file and the stored response commit in one transaction, or not at all.
// Claim begins the transaction (BEGIN IMMEDIATE, which takes the file's
// write lock) and inserts the claim in it; the handler takes the
// transaction with TxFromContext and writes in it; Complete stores the
// response in it and commits; Release rolls it back. A 5xx, a panic, a
// crash: in every case the writes and the claim roll back together.
//
// It fits SQLite's model, in which one writer works at a time: while a
// handler runs, its transaction holds the write lock, and every other
// claim that must write, of any key and any process, waits for it, within
// its store timeout, then fails (503). A replay does not wait: it reads.
// So handlers in this mode must be short, and must not call, through the
// same file, another request in this mode (it would wait for the lock that
// its caller holds). Claim.Abandoned is 0 in this mode, and Extend
// succeeds while the transaction is open. A step (package step) is written
// in the lease's transaction, the one TxFromContext returns, whatever the
// context SaveStep is given: another connection would wait for its lock.
// It commits with the response, which drops it, or rolls back with the
// claim, so that a retry after a Release runs every step again, as it
// runs every write of the handler again.
//
// # Errors
//
// Errors start with "sqlitestore:". One wrapping engine.ErrLeaseLost means
// the token is not the record's current one; engine.ErrNotStorable, a
// response over SQLite's limit of a value (a billion bytes), or a step over
// stepLimits.MaxSize or past stepLimits.MaxSteps;
// engine.ErrStoreClosed, a call after Close; engine.ErrNotCommitted, a
// Complete of transactional mode that did not commit. Every other error is
// a store failure, which the engine answers with 503.
package sqlitestore
