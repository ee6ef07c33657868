package sqlitestore

import (
	"context"
	"database/sql"
)

// table is the one table of the store's records, in the file that Open
// opens. Tokens are its rowids: SQLite gives a new row one more than the
// largest rowid in the table, so they never go back as long as the row with
// the largest is never deleted (https://www.sqlite.org/autoinc.html), and
// no statement deletes it: a Release or an operator's forgetting expires a
// record, and the sweeper deletes expired records other than that one. A
// takeover gives the row a new rowid too (excluded.token), the largest.
// Unlike AUTOINCREMENT, this writes no sequence table (sqlite_sequence) at
// each claim; a file whose table has AUTOINCREMENT works the same.
const table = "idempotency_records"

// schemaSQL creates the table and its index if they are missing. Every time
// is in microseconds since the Unix epoch, by the machine's clock, which
// every process sharing the file reads.
//
// The sweeper finds expired records by sweep_at, the one time indexed: a
// record may be deleted once both it and expires_at have passed, and every
// statement keeps expires_at <= sweep_at. The claim sets both to the
// record's expiry; the common Complete, within the lease, moves expires_at
// earlier and leaves sweep_at, and so the index, alone (one page fewer to
// write per first execution); a record is then deleted at most a lease
// after it expired. A statement that moves expires_at later moves sweep_at
// with it.
//
// A record in flight keeps its steps in steps, a log of entries that
// SaveStep appends to (internal/sqlrecord), NULL when it holds none, and
// step_count counts the log's entries. A table made before steps lacks both
// columns: migrate adds them.
const schemaSQL = `CREATE TABLE IF NOT EXISTS ` + table + ` (
	token INTEGER PRIMARY KEY,
	scope BLOB NOT NULL,
	key BLOB NOT NULL,
	fingerprint BLOB NOT NULL,
	completed INTEGER NOT NULL DEFAULT 0,
	abandoned INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	lease_until INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	sweep_at INTEGER NOT NULL,
	status INTEGER,
	headers BLOB,
	body BLOB,
	body_omitted INTEGER NOT NULL DEFAULT 0,
	steps BLOB,
	step_count INTEGER NOT NULL DEFAULT 0,
	UNIQUE (scope, key)
);
CREATE INDEX IF NOT EXISTS ` + table + `_sweep_at ON ` + table + ` (sweep_at)`

// stepColumns are the columns that steps added to the table, with their
// definitions.
var stepColumns = [][2]string{{"steps", "BLOB"}, {"step_count", "INTEGER NOT NULL DEFAULT 0"}}

// readSQL reads the record of a key, live or not: a Claim's first
// statement, which writes nothing, so that a replay takes no lock. It
// leaves the steps, which the claim returns. Parameters: scope, key.
const readSQL = `SELECT token, completed, fingerprint, abandoned, created_at, lease_until, expires_at,
	status, headers, body, body_omitted
FROM ` + table + ` WHERE scope = ?1 AND key = ?2`

// lookupSQL is readSQL with the steps.
const lookupSQL = `SELECT token, completed, fingerprint, abandoned, created_at, lease_until, expires_at,
	status, headers, body, body_omitted, steps
FROM ` + table + ` WHERE scope = ?1 AND key = ?2`

// claimSQL is the claim, in one statement: it inserts the record in flight
// when there is none, and takes over, in place, one that expired, or whose
// lease expired with the same fingerprint (the holder was lost: abandoned
// counts it, saturating; an expired record starts afresh at 0, without
// steps). Either way the row gets the new token that the INSERT drew from
// the sequence (excluded.token). A record that is neither is left alone and
// the statement returns no row. The SET expressions read the row as it was.
// The row it returns carries the steps of a record taken over, as the
// claim left them: NULL for a new record, which so costs nothing more.
//
// Parameters: ?1 scope, ?2 key, ?3 fingerprint, ?4 now, ?5 lease's end,
// ?6 expiry.
const claimSQL = `INSERT INTO ` + table + ` (token, scope, key, fingerprint, completed, abandoned, created_at, lease_until, expires_at, sweep_at)
VALUES (NULL, ?1, ?2, ?3, 0, 0, ?4, ?5, ?6, ?6)
ON CONFLICT (scope, key) DO UPDATE SET
	token = excluded.token,
	fingerprint = excluded.fingerprint,
	completed = 0,
	abandoned = CASE WHEN expires_at <= ?4 THEN 0 ELSE min(abandoned, 2147483646) + 1 END,
	created_at = CASE WHEN expires_at <= ?4 THEN ?4 ELSE created_at END,
	lease_until = excluded.lease_until,
	expires_at = excluded.expires_at,
	sweep_at = excluded.sweep_at,
	status = NULL, headers = NULL, body = NULL, body_omitted = 0,
	steps = CASE WHEN expires_at <= ?4 THEN NULL ELSE steps END,
	step_count = CASE WHEN expires_at <= ?4 THEN 0 ELSE step_count END
WHERE expires_at <= ?4 OR (completed = 0 AND lease_until <= ?4 AND fingerprint = excluded.fingerprint)
RETURNING token, abandoned, steps`

// held is the record that Complete, Release, Extend and SaveStep may
// change: held by the token, in flight, not expired. Parameters: ?1 token,
// ?2 scope, ?3 key, ?4 now.
const held = heldTx + ` AND expires_at > ?4`

// heldTx is held in transactional mode, where the transaction, not the
// record's expiry, keeps others off the record.
const heldTx = `token = ?1 AND scope = ?2 AND key = ?3 AND completed = 0`

// noSteps drops a record's steps: a response replaces them.
const noSteps = `steps = NULL, step_count = 0`

// completeSQL stores the response, and drops the steps, when its expiry is
// not later than sweep_at, as it is for a Complete within the lease: it
// leaves sweep_at alone. More parameters: ?5 expiry, ?6 status, ?7 headers,
// ?8 body, ?9 body omitted.
const completeSQL = `UPDATE ` + table + ` SET completed = 1, lease_until = ?4, expires_at = ?5,
	status = ?6, headers = ?7, body = ?8, body_omitted = ?9, ` + noSteps + `
WHERE ` + held + ` AND sweep_at >= ?5`

// completeLateSQL is completeSQL for a record that completeSQL did not
// change: it moves sweep_at too.
const completeLateSQL = `UPDATE ` + table + ` SET completed = 1, lease_until = ?4, expires_at = ?5, sweep_at = max(sweep_at, ?5),
	status = ?6, headers = ?7, body = ?8, body_omitted = ?9, ` + noSteps + `
WHERE ` + held

// completeTxSQL is completeSQL in transactional mode, where the
// transaction, not the record's expiry, keeps others off the record.
const completeTxSQL = `UPDATE ` + table + ` SET completed = 1, lease_until = ?4, expires_at = ?5, sweep_at = max(sweep_at, ?5),
	status = ?6, headers = ?7, body = ?8, body_omitted = ?9, ` + noSteps + `
WHERE ` + heldTx

// releaseSQL makes a record that the holder's claim created, and that
// holds no steps, expire now, so that the key is new again, and lets the
// sweeper delete it.
const releaseSQL = `UPDATE ` + table + ` SET lease_until = min(lease_until, ?4), expires_at = ?4, sweep_at = ?4
WHERE ` + held + ` AND abandoned <= 0 AND steps IS NULL`

// releaseBackSQL puts a record that the holder's claim took over from lost
// holders, or that holds steps, back as the claim found it: its lease
// ended, one lost holder fewer (the next takeover counts it again; a
// record its holder created goes to -1, which the next takeover makes 0),
// its steps kept, and a new token from the sequence, which no holder has.
// The SELECT finds the row only if the holder still holds it, and the
// conflict on its own key makes the INSERT the UPDATE.
const releaseBackSQL = `INSERT INTO ` + table + ` (token, scope, key, fingerprint, created_at, lease_until, expires_at, sweep_at)
SELECT NULL, scope, key, fingerprint, created_at, lease_until, expires_at, sweep_at FROM ` + table + `
WHERE ` + held + ` AND (abandoned > 0 OR steps IS NOT NULL)
ON CONFLICT (scope, key) DO UPDATE SET
	token = excluded.token,
	lease_until = min(lease_until, ?4),
	abandoned = abandoned - 1`

// extendSQL moves the lease's end, and the record's expiry with it, so that
// the record outlives the lease by as much as it did. More parameters:
// ?5 the lease's new end. The expressions read the row as it was.
const extendSQL = `UPDATE ` + table + ` SET lease_until = ?5,
	expires_at = max(expires_at, ?5 + (expires_at - lease_until)),
	sweep_at = max(sweep_at, expires_at, ?5 + (expires_at - lease_until))
WHERE ` + held

// sweepSQL deletes at most ?2 records expired at ?1, never the one with the
// largest token.
const sweepSQL = `DELETE FROM ` + table + ` WHERE token IN (
	SELECT token FROM ` + table + ` WHERE sweep_at <= ?1 AND expires_at <= ?1
		AND token < (SELECT max(token) FROM ` + table + `) LIMIT ?2)`

// resolveSQL records a live record as done with the operator's response,
// whatever its state and lease. Parameters: ?1 scope, ?2 key, ?3 now,
// ?4 expiry, ?5 status, ?6 headers, ?7 body, ?8 body omitted.
const resolveSQL = `UPDATE ` + table + ` SET completed = 1, lease_until = min(lease_until, ?3), expires_at = ?4, sweep_at = max(sweep_at, ?4),
	status = ?5, headers = ?6, body = ?7, body_omitted = ?8, ` + noSteps + `
WHERE scope = ?1 AND key = ?2 AND expires_at > ?3`

// forgetSQL makes a live record expire now, without its steps, and lets
// the sweeper delete it. Parameters: ?1 scope, ?2 key, ?3 now.
const forgetSQL = `UPDATE ` + table + ` SET lease_until = min(lease_until, ?3), expires_at = ?3, sweep_at = ?3, ` + noSteps + `
WHERE scope = ?1 AND key = ?2 AND expires_at > ?3`

// stepAppendSQL records a step in one statement: it appends the step's
// entry to the record's log (internal/sqlrecord), if the record is held by
// the token and its log has fewer than ?5 entries (100 (the most steps)).
// SQLite's || makes text of its operands, byte for byte, and the CAST makes
// the bytes a BLOB again. Parameters: ?1 token, ?2 scope, ?3 key, ?4 entry,
// ?5 the most entries, ?6 now.
const stepAppendSQL = stepAppendTxSQL + ` AND expires_at > ?6`

// stepAppendTxSQL is stepAppendSQL in transactional mode, without ?6.
const stepAppendTxSQL = `UPDATE ` + table + ` SET steps = CAST(coalesce(steps, x'') || ?4 AS BLOB), step_count = step_count + 1
WHERE ` + heldTx + ` AND step_count < ?5`

// stepReadSQL reads the log of the record held by the token, in the
// transaction that rewrites it (stepWriteSQL). Parameters: as held's.
const stepReadSQL = `SELECT steps FROM ` + table + ` WHERE ` + held

// stepReadTxSQL is stepReadSQL in transactional mode, without ?4.
const stepReadTxSQL = `SELECT steps FROM ` + table + ` WHERE ` + heldTx

// stepWriteSQL rewrites the log that stepReadSQL read, in its transaction.
// Parameters: ?1 token, ?2 the log, ?3 its entries.
const stepWriteSQL = `UPDATE ` + table + ` SET steps = ?2, step_count = ?3 WHERE token = ?1`

// stmts are the Store's statements, prepared once by Open: database/sql
// prepares each again on every connection that runs it, not at every call,
// and Close closes them.
type stmts struct {
	read, claim, complete, completeLate, completeTx, release, releaseBack, extend, sweep, resolve, forget, lookup,
	stepAppend, stepAppendTx, stepRead, stepReadTx, stepWrite *sql.Stmt
}

func prepare(ctx context.Context, db *sql.DB) (stmts, error) {
	var st stmts
	for _, p := range []struct {
		st    **sql.Stmt
		query string
	}{
		{&st.read, readSQL}, {&st.claim, claimSQL}, {&st.complete, completeSQL}, {&st.completeLate, completeLateSQL}, {&st.completeTx, completeTxSQL},
		{&st.release, releaseSQL}, {&st.releaseBack, releaseBackSQL}, {&st.extend, extendSQL}, {&st.sweep, sweepSQL},
		{&st.resolve, resolveSQL}, {&st.forget, forgetSQL}, {&st.lookup, lookupSQL},
		{&st.stepAppend, stepAppendSQL}, {&st.stepAppendTx, stepAppendTxSQL}, {&st.stepRead, stepReadSQL},
		{&st.stepReadTx, stepReadTxSQL}, {&st.stepWrite, stepWriteSQL},
	} {
		var err error
		if *p.st, err = db.PrepareContext(ctx, p.query); err != nil {
			st.close()
			return stmts{}, err
		}
	}
	return st, nil
}

// close closes the statements that are prepared.
func (st *stmts) close() {
	for _, s := range []*sql.Stmt{st.read, st.claim, st.complete, st.completeLate, st.completeTx, st.release, st.releaseBack, st.extend,
		st.sweep, st.resolve, st.forget, st.lookup, st.stepAppend, st.stepAppendTx, st.stepRead, st.stepReadTx, st.stepWrite} {
		if s != nil {
			s.Close()
		}
	}
}
