package pgstore

import (
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/internal/steps"
)

// queries are a Store's statements, written once for its table. Every time
// comes from the database's clock, statement_timestamp(), so that instances
// on several machines agree on leases and expiry, and so that a statement
// late in a long transaction (Complete, in transactional mode) uses its own
// time rather than the transaction's start. Durations are bound as
// microseconds.
type queries struct {
	// insert inserts a new key's record, and read reads the key (see
	// Store.readFirst). The sized versions read the table's size too, for
	// a Claim that reads it (see Store.sizeDue).
	read, readSized, insert, insertSized                   string
	takeover, complete, completeTx, release, extend, sweep string
	lookup, resolve, forget                                string
	// saveStep and saveStepTx record a step, in lease mode and in
	// transactional mode.
	saveStep, saveStepTx string
}

// newQueries writes the statements for the table n names, in the version
// that a Store uses while the table's size is in the given plan epoch (see
// planEpoch): the statements that run on every request end with a comment
// that names the epoch, so that each epoch's are distinct statements, which
// pgx prepares afresh and PostgreSQL plans for the table's size.
//
// In transactional mode the statements that give a lease return the
// backend's process ID and the start of the transaction they run in, which
// identify the transaction of the lease (see txwatch.go); in lease mode
// they return neither.
func newQueries(n names, epoch int, transactional bool) queries {
	backend := ""
	if transactional {
		backend = ", pg_backend_pid(), transaction_timestamp()"
	}
	r := strings.NewReplacer("{{table}}", n.table, "{{sequence}}", n.sequence, "{{backend}}", backend,
		"{{maxSteps}}", strconv.Itoa(steps.MaxSteps))
	tag := "\n/* pgstore plan epoch " + strconv.Itoa(epoch) + " */"
	hot := func(sql string) string { return r.Replace(sql) + tag }
	unsized := strings.NewReplacer("{{size}}", "-1::bigint")
	sized := strings.NewReplacer("{{size}}", "pg_relation_size(tableoid)")
	return queries{
		read:        hot(unsized.Replace(readSQL)),
		readSized:   hot(sized.Replace(readSQL)),
		insert:      hot(unsized.Replace(insertSQL)),
		insertSized: hot(sized.Replace(insertSQL)),
		takeover:    hot(takeoverSQL),
		complete:    hot(completeSQL),
		// In transactional mode the transaction's row lock, not the
		// record's time to live, keeps others off the record: a handler
		// that runs longer than the record lives still completes it.
		completeTx: hot(completeTxSQL),
		release:    hot(releaseSQL),
		extend:     hot(extendSQL),
		saveStep:   hot(saveStepSQL(current)),
		saveStepTx: hot(saveStepSQL(currentTx)),
		sweep:      r.Replace(sweepSQL),
		lookup:     r.Replace(lookupSQL),
		resolve:    r.Replace(resolveSQL),
		forget:     r.Replace(forgetSQL),
	}
}

// readSQL reads the record of a key, a plain SELECT of the row, which
// writes nothing. The record's times are compared with the statement's by
// the Store, which reads it here too: the database's clock, as everywhere.
// It returns first false (not inserted), then the record's columns, the
// statement's time, and, in the sized version, the table's size in bytes,
// for planEpoch, read from the relation of the row (tableoid); -1 in the
// other. In transactional mode come the backend (see newQueries). A Claim
// that finds no record follows it with insertSQL.
//
// Parameters: $1 scope, $2 key.
const readSQL = `SELECT false, token, state, fingerprint, lease_until, expires_at, coalesce(status, 0),
	headers, body, body_omitted, statement_timestamp(), {{size}}{{backend}}
FROM {{table}}
WHERE scope = $1 AND key = $2`

// insertSQL inserts a new record in flight when the key has none. ON
// CONFLICT DO NOTHING keeps the claim atomic: when a concurrent claimer's
// row is there, it waits for that row's transaction and inserts nothing if
// it commits, and the statement returns no row; Claim then reads the key
// (readSQL, whose statement sees the row). The token that such an INSERT
// drew from the sequence is lost, a gap of no consequence; it is drawn
// before the conflict is found, so an INSERT that finds a record takes a
// value of the sequence too.
//
// It returns the token, the table's size as readSQL does, and, in
// transactional mode, the backend (see newQueries).
//
// Parameters: $1 scope, $2 key, $3 fingerprint, $4 lease (µs), $5 the
// record's life (µs: the lease and then the time to live).
const insertSQL = `INSERT INTO {{table}} (scope, key, fingerprint, state, token, lease_until, created_at, expires_at, sweep_at)
VALUES ($1, $2, $3, 'in_flight', nextval('{{sequence}}'),
	statement_timestamp() + $4::bigint * interval '1 microsecond',
	statement_timestamp(),
	statement_timestamp() + $5::bigint * interval '1 microsecond',
	` + sweepAtFrom + inFlightSweep + sweepAtTo + `)
ON CONFLICT (scope, key) DO NOTHING
RETURNING token, {{size}}{{backend}}`

// takeoverSQL gives a new lease on a record that Claim found expired, or in
// flight with an expired lease and the same fingerprint. It changes the row
// only if it is still the one Claim saw (same token) and still eligible. A
// record in flight whose lease ended was abandoned by its holder: abandoned
// counts it (saturating, so that the column never overflows); an expired
// record starts afresh, at 0, without steps.
//
// It returns the record's steps, which the new holder resumes from: those
// of the row it changed, so that a step that the lost holder recorded
// between the claim's read and this UPDATE is not missed (the UPDATE waits
// for that holder's statement and sees its row).
//
// Parameters: $1 scope, $2 key, $3 token seen, $4 fingerprint, $5 lease
// (µs), $6 the record's life (µs: the lease and then the time to live).
const takeoverSQL = `UPDATE {{table}} SET
	fingerprint = $4,
	state = 'in_flight',
	token = nextval('{{sequence}}'),
	lease_until = statement_timestamp() + $5::bigint * interval '1 microsecond',
	created_at = CASE WHEN expires_at <= statement_timestamp() THEN statement_timestamp() ELSE created_at END,
	expires_at = statement_timestamp() + $6::bigint * interval '1 microsecond',
	sweep_at = ` + sweepAtFrom + takeoverSweep + sweepAtTo + `,
	status = NULL, headers = NULL, body = NULL, body_omitted = false,
	abandoned = CASE WHEN expires_at <= statement_timestamp() THEN 0
		ELSE least(abandoned, 2147483646) + 1 END,
	steps = CASE WHEN expires_at <= statement_timestamp() THEN NULL ELSE steps END
WHERE scope = $1 AND key = $2 AND token = $3
	AND (expires_at <= statement_timestamp()
		OR (state = 'in_flight' AND lease_until <= statement_timestamp() AND fingerprint = $4))
RETURNING token, abandoned, steps{{backend}}`

// The record that Complete, Release and Extend may change: held by the token,
// in flight, not expired.
const current = `scope = $1 AND key = $2 AND token = $3
	AND state = 'in_flight' AND expires_at > statement_timestamp()`

// currentTx is current in transactional mode, where the record cannot have
// been taken over, whatever its expiry, while the transaction holds it.
const currentTx = `scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// completeSet stores the response, which replaces the steps. Unless the
// record's expiry moves to another minute, no indexed column changes (see
// sweepAtFrom), so PostgreSQL can make the UPDATE a HOT one. Parameters: $1
// scope, $2 key, $3 token, $4 time to live (µs), $5 status, $6 headers, $7
// body, $8 body omitted.
const completeSet = `UPDATE {{table}} SET
	state = 'completed',
	lease_until = statement_timestamp(),
	expires_at = statement_timestamp() + $4::bigint * interval '1 microsecond',
	sweep_at = ` + sweepAtFrom + `statement_timestamp() + $4::bigint * interval '1 microsecond'` + sweepAtTo + `,
	status = $5, headers = $6, body = $7, body_omitted = $8, steps = NULL
WHERE `

const (
	completeSQL   = completeSet + current
	completeTxSQL = completeSet + currentTx
)

// releaseSQL deletes the record that the holder's claim created
// (abandoned 0) when it holds no steps, or, when the claim took it over
// from lost holders or the record holds steps, puts it back as the claim
// found it: in flight, its lease ended, abandoned one less (the takeover
// counted the holder lost before it, and the next one counts it again; -1
// after the release of the holder that created it, which the next takeover
// brings back to 0), its steps kept, and a token of its own, which no
// holder has, so that the releasing holder is refused from then on. Its
// expiry stays. The two changes are exclusive: at most one of them finds
// the row, and the statement returns how many did. Parameters: $1 scope,
// $2 key, $3 token.
const releaseSQL = `WITH back AS (
	UPDATE {{table}} SET
		token = nextval('{{sequence}}'),
		lease_until = least(lease_until, statement_timestamp()),
		abandoned = abandoned - 1
	WHERE ` + current + ` AND (abandoned > 0 OR steps IS NOT NULL)
	RETURNING 1
), gone AS (
	DELETE FROM {{table}} WHERE ` + current + ` AND abandoned <= 0 AND steps IS NULL
	RETURNING 1
)
SELECT (SELECT count(*) FROM back) + (SELECT count(*) FROM gone)`

// extendSQL moves the lease's end, and the record's expiry with it, so that
// the record outlives the lease by as much as it did (the TTL that the
// claim gave it). sweep_at stays (see inFlightSweep), so that no indexed
// column changes. Parameters: $1 scope, $2 key, $3 token, $4 lease (µs).
const extendSQL = `UPDATE {{table}} SET
	lease_until = statement_timestamp() + $4::bigint * interval '1 microsecond',
	expires_at = greatest(expires_at, statement_timestamp() + $4::bigint * interval '1 microsecond' + (expires_at - lease_until))
WHERE ` + current

// saveStepSQL returns the statement that records one step in the record
// that the token holds (held: current, or currentTx in transactional mode,
// in the lease's transaction, which holds the row): it replaces the element
// of the step's name, removes it when $5 is NULL, and adds a step only
// while the record holds fewer than 100 (steps.MaxSteps) others. The statement answers 0 when it saved the step, 1
// when the record is held but has no room, 2 when the token does not hold
// the record. The second look runs only when the UPDATE changed nothing,
// and locks the row, as the UPDATE would have, so that it judges the
// version the UPDATE judged, not the statement's snapshot: a lease lost to
// a takeover that committed while the UPDATE waited is told as lost.
//
// Parameters: $1 scope, $2 key, $3 token, $4 the name's prefix of the
// step's element (see stepPrefix), $5 the element (see encodeStep), or NULL
// to remove the step.
func saveStepSQL(held string) string {
	return `WITH saved AS (
	UPDATE {{table}} SET steps = CASE WHEN $5::bytea IS NULL THEN ` + stepsKept + `
		ELSE array_append(` + stepsKept + `, $5::bytea) END
	WHERE ` + held + ` AND ` + stepFits + `
	RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT FROM saved) THEN 0
	WHEN EXISTS (SELECT FROM {{table}} WHERE ` + held + ` FOR NO KEY UPDATE) THEN 1
	ELSE 2 END`
}

// stepsKept is the record's steps but the one whose name $4 starts.
const stepsKept = `(SELECT array_agg(e) FROM unnest(steps) AS e
		WHERE substring(e FROM 1 FOR octet_length($4::bytea)) <> $4::bytea)`

// stepFits says that the step may be saved: it is a removal, or the record
// holds fewer than 100 steps, or one of the same name, which it
// replaces.
const stepFits = `($5::bytea IS NULL OR coalesce(cardinality(steps), 0) < {{maxSteps}}
		OR EXISTS (SELECT FROM unnest(steps) AS e WHERE substring(e FROM 1 FOR octet_length($4::bytea)) = $4::bytea))`

// sweepSQL deletes at most $1 expired records. PostgreSQL has no DELETE ...
// LIMIT: the sub-select picks the rows by ctid, through the sweep_at index,
// and locks them; SKIP LOCKED leaves alone the rows a Claim is taking over,
// and any other sweeper's, so that concurrent sweeps never wait for one
// another. A record is swept within a minute of its expiry (sweep_at is at
// most that later, and, in flight, may be earlier, see inFlightSweep); the
// rows written before sweep_at existed ('-infinity') are tested on
// expires_at alone.
const sweepSQL = `DELETE FROM {{table}}
WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM {{table}}
	WHERE sweep_at <= statement_timestamp() AND expires_at <= statement_timestamp()
	LIMIT $1
	FOR UPDATE SKIP LOCKED))
AND expires_at <= statement_timestamp()`

// lookupSQL reads a live record for Inspector.Lookup, and for a Claim that a
// read-only server refused. Parameters: $1 scope, $2 key.
const lookupSQL = `SELECT state, fingerprint, token, abandoned, created_at, lease_until, expires_at,
	lease_until > statement_timestamp(),
	(extract(epoch FROM lease_until - statement_timestamp()) * 1000000)::bigint,
	coalesce(status, 0), headers, body, body_omitted, steps
FROM {{table}}
WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp()`

// resolveSQL records a live record as done with the operator's response,
// whatever its state and lease, and drops its steps: its state is no longer
// in flight, so the holder's token is refused from then on. Parameters: $1
// scope, $2 key, $3 time to live (µs), $4 status, $5 headers, $6 body, $7
// body omitted.
const resolveSQL = `UPDATE {{table}} SET
	state = 'completed',
	lease_until = least(lease_until, statement_timestamp()),
	expires_at = statement_timestamp() + $3::bigint * interval '1 microsecond',
	sweep_at = ` + sweepAtFrom + `statement_timestamp() + $3::bigint * interval '1 microsecond'` + sweepAtTo + `,
	status = $4, headers = $5, body = $6, body_omitted = $7, steps = NULL
WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp()`

// forgetSQL deletes a live record, for Inspector.Resolve without a response.
// Parameters: $1 scope, $2 key.
const forgetSQL = `DELETE FROM {{table}} WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp()`

// inFlightSweep is the time that a claim's sweep_at is made from: the
// claim's time plus the TTL ($5, the record's life, less $4, the lease),
// not the record's expiry, which comes a lease later. A Complete soon after
// then gives the record the same sweep_at, and its UPDATE stays a HOT one
// (see sweepAtFrom). The sweep finds an in-flight record through the index
// up to a lease (and its renewals) before it expires, and leaves it until
// it does: only a record whose holder was lost or runs long waits so.
const inFlightSweep = `statement_timestamp() + ($5::bigint - $4::bigint) * interval '1 microsecond'`

// takeoverSweep is inFlightSweep with takeoverSQL's parameters.
const takeoverSweep = `statement_timestamp() + ($6::bigint - $5::bigint) * interval '1 microsecond'`

// sweepAtFrom and sweepAtTo enclose the SQL of a record's expiry to make
// that of its sweep_at: the expiry rounded up to the next whole minute (of
// the Unix epoch, so the session's time zone plays no part), at most a
// minute later. The sweep finds records through an index on sweep_at rather
// than on expires_at, which every Complete changes and which would make each
// Complete's UPDATE write new index entries: PostgreSQL makes an UPDATE a HOT
// one, which adds none, only when no indexed column's value changes, and a
// Complete changes sweep_at only when the new expiry falls in another minute
// than the claim's time plus the TTL (for a handler that runs a second, once
// in 60 times; an in-flight record's sweep_at is made from that, not from
// its expiry, see inFlightSweep).
const (
	sweepAtFrom = "date_bin(interval '1 minute', "
	sweepAtTo   = ", timestamptz 'epoch') + interval '1 minute'"
)
