package mysqlstore

import (
	"regexp"
	"strings"
)

// nowUS is the server's clock in microseconds since the Unix epoch, in UTC
// whatever the session's time zone. UTC_TIMESTAMP(6) is the statement's
// start, the same at every mention in one statement, so that a statement's
// comparisons and writes agree, and every instance sharing the table reads
// one clock.
const nowUS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

// queries are a Store's statements, written once for its table.
type queries struct {
	// claimOrder are claim's parameters, in their order.
	claimOrder []claimParam

	schema, read, claim, complete, completeTx, releaseBack, release, extend, sweep, lookup, resolve, forget string

	// stepProbe[i] fails when the table lacks stepColumns[i], and
	// stepAdd[i] adds it.
	stepProbe, stepAdd                                        [2]string
	stepAppend, stepAppendTx, stepRead, stepReadTx, stepWrite string
}

func newQueries(table string) queries {
	r := strings.NewReplacer("{{table}}", table, "{{now}}", nowUS)
	claim, order := placeholders(r.Replace(claimSQL))
	q := queries{
		claimOrder:   order,
		schema:       r.Replace(schemaSQL),
		read:         r.Replace(strings.Replace(readSQL, "{{steps}}", stepsIfTakeover, 1)),
		claim:        claim,
		complete:     r.Replace(completeSQL + heldSQL),
		completeTx:   r.Replace(completeSQL + heldTxSQL),
		releaseBack:  r.Replace(releaseBackSQL),
		release:      r.Replace(releaseSQL),
		extend:       r.Replace(extendSQL),
		sweep:        r.Replace(sweepSQL),
		lookup:       r.Replace(strings.Replace(readSQL, "{{steps}}", "steps", 1) + " AND expires_at > {{now}}"),
		resolve:      r.Replace(resolveSQL),
		forget:       r.Replace(forgetSQL),
		stepAppend:   r.Replace(stepAppendSQL + heldSQL + stepRoomSQL),
		stepAppendTx: r.Replace(stepAppendSQL + heldTxSQL + stepRoomSQL),
		stepRead:     r.Replace(stepReadSQL + heldSQL + " FOR UPDATE"),
		stepReadTx:   r.Replace(stepReadSQL + heldTxSQL + " FOR UPDATE"),
		stepWrite:    r.Replace(stepWriteSQL),
	}
	for i, c := range stepColumns {
		q.stepProbe[i] = r.Replace("SELECT " + c[0] + " FROM {{table}} WHERE FALSE")
		q.stepAdd[i] = r.Replace("ALTER TABLE {{table}} ADD COLUMN " + c[0] + " " + c[1])
	}
	return q
}

// schemaSQL creates the table. Times are BIGINT microseconds (see nowUS);
// scope and key are binary strings, compared byte for byte, of at most
// 1024 bytes each (the primary key's limit). A record in flight keeps its
// steps in steps, a log of entries that SaveStep appends to
// (internal/sqlrecord), NULL when it holds none, and step_count counts the
// log's entries; a table made before steps lacks both columns, which
// Migrate adds (stepColumns).
const schemaSQL = "CREATE TABLE IF NOT EXISTS {{table}} (" + `
	scope VARBINARY(1024) NOT NULL,
	` + "`key`" + ` VARBINARY(1024) NOT NULL,
	fingerprint BLOB NOT NULL,
	completed BOOLEAN NOT NULL DEFAULT FALSE,
	token BIGINT NOT NULL,
	version BIGINT NOT NULL DEFAULT 0,
	abandoned INT NOT NULL DEFAULT 0,
	created_at BIGINT NOT NULL,
	lease_until BIGINT NOT NULL,
	expires_at BIGINT NOT NULL,
	status INT NULL,
	headers LONGBLOB NULL,
	body LONGBLOB NULL,
	body_omitted BOOLEAN NOT NULL DEFAULT FALSE,
	steps LONGBLOB NULL,
	step_count INT NOT NULL DEFAULT 0,
	PRIMARY KEY (scope, ` + "`key`" + `),
	KEY expires_at (expires_at)
) ENGINE=InnoDB`

// stepColumns are the columns that steps added to the table, with their
// definitions.
var stepColumns = [2][2]string{{"steps", "LONGBLOB NULL"}, {"step_count", "INT NOT NULL DEFAULT 0"}}

// readSQL reads the record of a key, live or not, with the server's clock:
// a Claim's first statement, a consistent read that takes no lock.
// Parameters: scope, key. Its last column is the steps ({{steps}}): all
// of them for Lookup, and, for a Claim, stepsIfTakeover.
const readSQL = `SELECT token, completed, fingerprint, abandoned, created_at, lease_until, expires_at,
	status, headers, body, body_omitted, {{now}}, version, {{steps}}
FROM {{table}} WHERE scope = ? AND ` + "`key`" + ` = ?`

// stepsIfTakeover is the steps of a record that the Claim may take over (in
// flight, its lease over, not expired), which the claim then returns: the
// claim changes the row only if it is still the one read, steps included.
// A replay, a new key and a request in flight are read without them.
const stepsIfTakeover = `IF(NOT completed AND lease_until <= {{now}} AND expires_at > {{now}}, steps, NULL)`

// claimSQL is the claim and the takeover in one statement: INSERT … ON
// DUPLICATE KEY UPDATE, with every assignment conditional on "the row is
// still the one the Claim read" (version = :seen). Claim writes only after
// its read found no record, or one that may be taken over (it expired, or
// its lease did with the same fingerprint); every statement that changes a
// row changes its version, and time only moves forward, so a row with the
// version read may still be taken over.
//
// The UPDATE clause names the parameters again rather than the row that
// the INSERT proposed: VALUES() is deprecated in MySQL 8.0.20 and a row
// alias (VALUES … AS new) is unknown to MariaDB, and a derived table of
// the parameters (INSERT … SELECT … FROM (SELECT ? …) AS p), which both
// accept, costs the server a temporary table at every claim. So the
// statement names its parameters (:scope, :key, :fp, :lease, :life,
// :seen), and newQueries turns each mention into a placeholder (see
// claimArgs). The clock ({{now}}) is the statement's start at every
// mention. CAST(? AS BINARY) keeps the bytes of scope, key and fingerprint
// from the connection's character set.
//
// The server tells the client what happened without another statement:
// LAST_INSERT_ID(expr) sets the insert ID that the OK packet carries. The
// INSERT's sets it to the new token; the UPDATE's sets it to the new token
// when the row is the one read, and to 0 when it is not. So the insert ID
// is 0 when nothing changed, and otherwise the token, with 1 affected row
// for an insert and 2 for a takeover, whether or not the connection reports
// found rows (clientFoundRows), which counts an unchanged row as 1 rather
// than 0.
//
// Tokens are the server's clock in microseconds times 1024 for a new record,
// and, for a takeover, one more than the row's, or that, whichever is larger:
// larger than every token the key had while its row exists (a Release or an
// operator's forgetting expires the row and keeps it), and, once a sweep
// deleted the row, as long as the server's clock has not gone back by more
// than the second the sweep waits past each expiry.
//
// MySQL evaluates the assignments left to right, each seeing the ones
// before (MariaDB too, unless its SIMULTANEOUS_ASSIGNMENT mode is set, in
// which each sees the row as it was): the condition reads version alone,
// which comes last, and abandoned, created_at, steps and step_count,
// which read expires_at, come before it. An expired record starts afresh,
// without steps; one whose lease expired keeps them.
const claimSQL = `INSERT INTO {{table}} (scope, ` + "`key`" + `, fingerprint, completed, token, version, abandoned, created_at, lease_until, expires_at)
VALUES (CAST(:scope AS BINARY), CAST(:key AS BINARY), CAST(:fp AS BINARY), FALSE, LAST_INSERT_ID({{now}} * 1024), 0, 0,
	{{now}}, {{now}} + :lease, {{now}} + :life)
ON DUPLICATE KEY UPDATE
	abandoned = IF(` + same + `, IF({{table}}.expires_at <= {{now}}, 0, LEAST({{table}}.abandoned, 2147483646) + 1), {{table}}.abandoned),
	created_at = IF(` + same + `, IF({{table}}.expires_at <= {{now}}, {{now}}, {{table}}.created_at), {{table}}.created_at),
	steps = IF(` + same + `, IF({{table}}.expires_at <= {{now}}, NULL, {{table}}.steps), {{table}}.steps),
	step_count = IF(` + same + `, IF({{table}}.expires_at <= {{now}}, 0, {{table}}.step_count), {{table}}.step_count),
	status = IF(` + same + `, NULL, {{table}}.status),
	headers = IF(` + same + `, NULL, {{table}}.headers),
	body = IF(` + same + `, NULL, {{table}}.body),
	body_omitted = IF(` + same + `, FALSE, {{table}}.body_omitted),
	fingerprint = IF(` + same + `, CAST(:fp AS BINARY), {{table}}.fingerprint),
	completed = IF(` + same + `, FALSE, {{table}}.completed),
	expires_at = IF(` + same + `, {{now}} + :life, {{table}}.expires_at),
	lease_until = IF(` + same + `, {{now}} + :lease, {{table}}.lease_until),
	token = IF(` + same + `, LAST_INSERT_ID(GREATEST({{table}}.token + 1, {{now}} * 1024)), {{table}}.token + LAST_INSERT_ID(0)),
	version = IF(` + same + `, {{table}}.version + 1, {{table}}.version)`

const same = `{{table}}.version = :seen`

// claimParam is a parameter of claimSQL.
type claimParam int

const (
	pScope claimParam = iota
	pKey
	pFP
	pLease
	pLife
	pSeen
)

// claimParamRE matches a mention of a parameter in claimSQL.
var claimParamRE = regexp.MustCompile(`:(scope|key|fp|lease|life|seen)\b`)

// placeholders replaces every mention of a parameter in query with a
// placeholder, and returns the parameters in their order.
func placeholders(query string) (string, []claimParam) {
	names := map[string]claimParam{":scope": pScope, ":key": pKey, ":fp": pFP, ":lease": pLease, ":life": pLife, ":seen": pSeen}
	var order []claimParam
	query = claimParamRE.ReplaceAllStringFunc(query, func(m string) string {
		order = append(order, names[m])
		return "?"
	})
	return query, order
}

// claimArgs are the arguments of the claim statement: scope, key and
// fingerprint, the lease and the record's life (the lease and then the
// time to live) in microseconds, and the version the Claim read (-1: none).
func (q queries) claimArgs(scope, key, fp []byte, lease, life, seen int64) []any {
	args := make([]any, len(q.claimOrder))
	for i, p := range q.claimOrder {
		switch p {
		case pScope:
			args[i] = scope
		case pKey:
			args[i] = key
		case pFP:
			args[i] = fp
		case pLease:
			args[i] = lease
		case pLife:
			args[i] = life
		case pSeen:
			args[i] = seen
		}
	}
	return args
}

// completeSQL stores the response, and drops the steps. Parameters: time
// to live (µs), status, headers, body, body omitted, then heldSQL's.
const completeSQL = `UPDATE {{table}} SET version = version + 1, completed = TRUE, lease_until = {{now}}, expires_at = {{now}} + ?,
	status = ?, headers = ?, body = ?, body_omitted = ?, ` + noSteps + `
`

// noSteps drops a record's steps: a response replaces them.
const noSteps = `steps = NULL, step_count = 0`

// heldSQL is the record that Complete, Release, Extend and SaveStep may
// change: held by the token, in flight, not expired. Parameters: scope, key, token.
const heldSQL = "WHERE scope = ? AND `key` = ? AND token = ? AND NOT completed AND expires_at > {{now}}"

// heldTxSQL is heldSQL in transactional mode, where the transaction, not
// the record's expiry, keeps others off the record.
const heldTxSQL = "WHERE scope = ? AND `key` = ? AND token = ? AND NOT completed"

// releaseBackSQL puts a record that the holder's claim took over from lost
// holders, or that holds steps, back as the claim found it: its lease
// ended, one lost holder fewer (the next takeover counts it again; a record
// its holder created goes to -1, which the next takeover makes 0), its
// steps kept, and a new token, which no holder has.
const releaseBackSQL = `UPDATE {{table}} SET version = version + 1, lease_until = LEAST(lease_until, {{now}}), abandoned = abandoned - 1,
	token = GREATEST(token + 1, {{now}} * 1024)
` + heldSQL + ` AND (abandoned > 0 OR steps IS NOT NULL)`

// releaseSQL makes a record that the holder's claim created, and that holds
// no steps, expire now: the key is new again, and the row keeps its token,
// so that the next claim's is larger.
const releaseSQL = `UPDATE {{table}} SET version = version + 1, lease_until = LEAST(lease_until, {{now}}), expires_at = {{now}}
` + heldSQL + ` AND abandoned <= 0 AND steps IS NULL`

// extendSQL moves the lease's end, and the record's expiry with it, so
// that the record outlives the lease by as much as it did. Parameters:
// lease (µs), then heldSQL's. The assignments run left to right.
const extendSQL = `UPDATE {{table}} SET version = version + 1,
	expires_at = GREATEST(expires_at, {{now}} + ? + (expires_at - lease_until)),
	lease_until = {{now}} + ?
` + heldSQL

// sweepSQL deletes at most ? records expired more than a second ago.
const sweepSQL = `DELETE FROM {{table}} WHERE expires_at <= {{now}} - 1000000 ORDER BY expires_at LIMIT ?`

// resolveSQL records a live record as done with the operator's response.
// Parameters: time to live (µs), status, headers, body, body omitted,
// scope, key.
const resolveSQL = `UPDATE {{table}} SET version = version + 1, completed = TRUE, lease_until = LEAST(lease_until, {{now}}),
	expires_at = {{now}} + ?, status = ?, headers = ?, body = ?, body_omitted = ?, ` + noSteps + `
WHERE scope = ? AND ` + "`key`" + ` = ? AND expires_at > {{now}}`

// forgetSQL makes a live record expire now, without its steps, so that the
// next request with the key runs; the row keeps its token. Parameters:
// scope, key.
const forgetSQL = `UPDATE {{table}} SET version = version + 1, lease_until = LEAST(lease_until, {{now}}), expires_at = {{now}}, ` + noSteps + `
WHERE scope = ? AND ` + "`key`" + ` = ? AND expires_at > {{now}}`

// stepAppendSQL records a step in one statement: it appends the step's
// entry to the record's log (internal/sqlrecord), if the record is held by
// the token (heldSQL or heldTxSQL follows), and stepRoomSQL after it. The
// entry is a binary string (CAST), and so is CONCAT's result. Parameters:
// the entry, then the held clause's, then stepRoomSQL's.
const stepAppendSQL = `UPDATE {{table}} SET version = version + 1, steps = CONCAT(COALESCE(steps, X''), CAST(? AS BINARY)),
	step_count = step_count + 1
`

// stepRoomSQL is the room the log must have for the entry: fewer than ?
// entries (100 (the most steps)), and a length, with the entry's (?), at most
// the server's max_allowed_packet less ? (maxPacketSlack). CONCAT returns
// NULL, with a mere warning, for a result longer than max_allowed_packet:
// appending to a log that long would drop every step it holds, and a row
// that long could not be read back.
const stepRoomSQL = ` AND step_count < ? AND COALESCE(LENGTH(steps), 0) + ? <= @@max_allowed_packet - ?`

// stepReadSQL reads, and locks, the log of the record held by the token
// (heldSQL or heldTxSQL and FOR UPDATE follow), in the transaction that
// rewrites it (stepWriteSQL), and the server's max_allowed_packet.
const stepReadSQL = `SELECT steps, @@max_allowed_packet FROM {{table}}
`

// stepWriteSQL rewrites the log that stepReadSQL read and locked, in its
// transaction. Parameters: the log, its entries, scope, key, token.
const stepWriteSQL = "UPDATE {{table}} SET version = version + 1, steps = ?, step_count = ? WHERE scope = ? AND `key` = ? AND token = ?"
