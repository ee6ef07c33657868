package pgstore

import (
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/engine"
)

// maxStored bounds the bytes of one stored response, its headers and body
// together with the record's ID. PostgreSQL refuses a protocol message, and
// a value, of a gigabyte or more (MaxAllocSize): the statement that stores
// the response, and the row that a replay reads, must each stay under it. A
// mebibyte is left for everything else the two messages carry.
const maxStored = 1<<30 - 1<<20

// storable returns an error wrapping engine.ErrNotStorable when resp, with
// its encoded headers, can never be stored, so that Complete does not send
// a gigabyte that the server must refuse, and on a connection it would close.
func storable(id engine.ID, resp *engine.Response, headers []byte) error {
	if resp.Status < 0 || resp.Status > math.MaxInt32 {
		return fmt.Errorf("%w: status %d", engine.ErrNotStorable, resp.Status)
	}
	if n := len(id.Scope) + len(id.Key) + len(headers) + len(resp.Body); n > maxStored {
		return fmt.Errorf("%w: %d bytes, over the %d that a record holds", engine.ErrNotStorable, n, maxStored)
	}
	return nil
}

// isNotStorable reports whether PostgreSQL refused to store a response for a
// reason that another try cannot change: class 54 (program_limit_exceeded:
// a value or a row over one of its limits) or class 22 (data_exception: a
// value it cannot take, such as an invalid byte sequence in a trigger's or
// a column's text). Neither depends on the server's state, only on the
// values sent.
func isNotStorable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "54", "22":
		return true
	}
	return false
}

// isReadOnly reports whether the server refused a write because it is read
// only: a hot standby, or default_transaction_read_only.
func isReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006" // read_only_sql_transaction
}

// closedWhileIdle reports whether a statement failed before the server ran
// it because its connection had been closed while it sat idle in the pool:
// by idle_session_timeout, which PostgreSQL announces with 57P05 before it
// closes the connection, or with nothing sent at all.
func closedWhileIdle(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P05" // idle_session_timeout
	}
	return pgconn.SafeToRetry(err)
}
