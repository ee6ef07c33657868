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
}

func newQueries(table string) queries {
	r := strings.NewReplacer("{{table}}", table, "{{now}}", nowUS)
	claim, order := placeholders(r.Replace(claimSQL))
	return queries{
		claimOrder:  order,
		schema:      r.Replace(schemaSQL),
		read:        r.Replace(readSQL),
		claim:       claim,
		complete:    r.Replace(completeSQL + heldSQL),
		completeTx:  r.Replace(completeSQL + heldTxSQL),
		releaseBack: r.Replace(releaseBackSQL),
		release:     r.Replace(releaseSQL),
		extend:      r.Replace(extendSQL),
		sweep:       r.Replace(sweepSQL),
		lookup:      r.Replace(readSQL + " AND expires_at > {{now}}"),
		resolve:     r.Replace(resolveSQL),
		forget:      r.Replace(forgetSQL),
	}
}

// schemaSQL creates the table. Times are BIGINT microseconds (see nowUS);
// scope and key are binary strings, compared byte for byte, of at most
// 1024 bytes each (the primary key's limit).
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
	PRIMARY KEY (scope, ` + "`key`" + `),
	KEY expires_at (expires_at)
) ENGINE=InnoDB`

// readSQL reads the record of a key, live or not, with the server's clock:
// a Claim's first statement, a consistent read that takes no lock.
// Parameters: scope, key.
const readSQL = `SELECT token, completed, fingerprint, abandoned, created_at, lease_until, expires_at,
	status, headers, body, body_omitted, {{now}}, version
FROM {{table}} WHERE scope = ? AND ` + "`key`" + ` = ?`

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
// which comes last, and abandoned and created_at, which read expires_at,
// come before it.
const claimSQL = `INSERT INTO {{table}} (scope, ` + "`key`" + `, fingerprint, completed, token, version, abandoned, created_at, lease_until, expires_at)
VALUES (CAST(:scope AS BINARY), CAST(:key AS BINARY), CAST(:fp AS BINARY), FALSE, LAST_INSERT_ID({{now}} * 1024), 0, 0,
	{{now}}, {{now}} + :lease, {{now}} + :life)
ON DUPLICATE KEY UPDATE
	abandoned = IF(` + same + `, IF({{table}}.expires_at <= {{now}}, 0, LEAST({{table}}.abandoned, 2147483646) + 1), {{table}}.abandoned),
	created_at = IF(` + same + `, IF({{table}}.expires_at <= {{now}}, {{now}}, {{table}}.created_at), {{table}}.created_at),
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

// completeSQL stores the response. Parameters: time to live (µs), status,
// headers, body, body omitted, then heldSQL's.
const completeSQL = `UPDATE {{table}} SET version = version + 1, completed = TRUE, lease_until = {{now}}, expires_at = {{now}} + ?,
	status = ?, headers = ?, body = ?, body_omitted = ?
`

// heldSQL is the record that Complete, Release and Extend may change: held
// by the token, in flight, not expired. Parameters: scope, key, token.
const heldSQL = "WHERE scope = ? AND `key` = ? AND token = ? AND NOT completed AND expires_at > {{now}}"

// heldTxSQL is heldSQL in transactional mode, where the transaction, not
// the record's expiry, keeps others off the record.
const heldTxSQL = "WHERE scope = ? AND `key` = ? AND token = ? AND NOT completed"

// releaseBackSQL puts a record that the holder's claim took over from lost
// holders back as the claim found it: its lease ended, one lost holder
// fewer (the next takeover counts it again), and a new token, which no
// holder has.
const releaseBackSQL = `UPDATE {{table}} SET version = version + 1, lease_until = LEAST(lease_until, {{now}}), abandoned = abandoned - 1,
	token = GREATEST(token + 1, {{now}} * 1024)
` + heldSQL + ` AND abandoned > 0`

// releaseSQL makes a record that the holder's claim created expire now: the
// key is new again, and the row keeps its token, so that the next claim's
// is larger.
const releaseSQL = `UPDATE {{table}} SET version = version + 1, lease_until = LEAST(lease_until, {{now}}), expires_at = {{now}}
` + heldSQL + ` AND abandoned <= 0`

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
	expires_at = {{now}} + ?, status = ?, headers = ?, body = ?, body_omitted = ?
WHERE scope = ? AND ` + "`key`" + ` = ? AND expires_at > {{now}}`

// forgetSQL makes a live record expire now, so that the next request with
// the key runs; the row keeps its token. Parameters: scope, key.
const forgetSQL = `UPDATE {{table}} SET version = version + 1, lease_until = LEAST(lease_until, {{now}}), expires_at = {{now}}
WHERE scope = ? AND ` + "`key`" + ` = ? AND expires_at > {{now}}`
