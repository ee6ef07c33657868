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
// succeeds while the transaction is open.
//
// # Errors
//
// Errors start with "sqlitestore:". One wrapping engine.ErrLeaseLost means
// the token is not the record's current one; engine.ErrNotStorable, a
// response over SQLite's limit of a value (a billion bytes);
// engine.ErrStoreClosed, a call after Close; engine.ErrNotCommitted, a
// Complete of transactional mode that did not commit. Every other error is
// a store failure, which the engine answers with 503.
package sqlitestore
