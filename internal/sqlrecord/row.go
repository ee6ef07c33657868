package sqlrecord

import (
	"database/sql"
	"fmt"
	"math"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Row is a record as the tables keep it: every time in microseconds since
// the Unix epoch, by the clock of whoever wrote it (the machine's, for
// SQLite; the server's, for MySQL).
type Row struct {
	Token       int64
	Completed   bool
	Fingerprint []byte
	Abandoned   int64
	Created     int64
	LeaseUntil  int64
	Expires     int64
	Status      int64
	Headers     []byte
	Body        []byte
	BodyOmitted bool
	// Steps is the log of the record's steps (see DecodeSteps), which
	// Scan does not read: a store reads it where it needs it.
	Steps []byte
}

// Columns lists the columns that Scan reads, in its order.
const Columns = "token, completed, fingerprint, abandoned, created_at, lease_until, expires_at, status, headers, body, body_omitted"

// Scan reads the columns of Columns, then into extra those that follow.
func (r *Row) Scan(s interface{ Scan(...any) error }, extra ...any) error {
	var (
		headers, body []byte
		status        sql.NullInt64
	)
	*r = Row{}
	dest := append([]any{&r.Token, &r.Completed, &r.Fingerprint, &r.Abandoned, &r.Created, &r.LeaseUntil,
		&r.Expires, &status, &headers, &body, &r.BodyOmitted}, extra...)
	if err := s.Scan(dest...); err != nil {
		return err
	}
	r.Status, r.Headers, r.Body = status.Int64, headers, body
	return nil
}

// Decision is what a Claim does with the row it read.
type Decision int

const (
	// Answer: the row answers the Claim (Completed or InFlight).
	Answer Decision = iota
	// Take: the row may be taken over (it expired, or its lease did and
	// the fingerprints are equal), or there is none: the Claim writes.
	Take
)

// Decide reads the row that a Claim with fingerprint found at now (found
// false: none). With Answer, the Claim is the answer.
func Decide(r Row, found bool, fingerprint string, now int64) (engine.Claim, Decision, error) {
	if !found || r.Expires <= now {
		return engine.Claim{}, Take, nil
	}
	if r.Completed {
		h, err := DecodeHeader(r.Headers)
		if err != nil {
			return engine.Claim{}, Answer, err
		}
		body := r.Body
		if body == nil {
			body = []byte{}
		}
		return engine.Claim{Status: engine.Completed, Fingerprint: string(r.Fingerprint),
			Response: &engine.Response{Status: int(r.Status), Header: h, Body: body, BodyOmitted: r.BodyOmitted}}, Answer, nil
	}
	if r.LeaseUntil > now {
		return engine.Claim{Status: engine.InFlight, Fingerprint: string(r.Fingerprint),
			RetryAfter: FromMicros(r.LeaseUntil - now)}, Answer, nil
	}
	if string(r.Fingerprint) != fingerprint {
		return engine.Claim{Status: engine.InFlight, Fingerprint: string(r.Fingerprint)}, Answer, nil
	}
	return engine.Claim{}, Take, nil
}

// Record is what Inspector.Lookup reports of a live row.
func (r Row) Record(id engine.ID) (engine.Record, error) {
	rec := engine.Record{
		ID:          id,
		Completed:   r.Completed,
		Fingerprint: string(r.Fingerprint),
		Token:       engine.Token(r.Token),
		// -1 after the release, by its creator, of a record that
		// keeps steps: the next takeover counts it back to 0.
		Abandoned: int(max(r.Abandoned, 0)),
		Created:   time.UnixMicro(r.Created),
		Expires:   time.UnixMicro(r.Expires),
	}
	if !r.Completed {
		rec.LeaseEnds = time.UnixMicro(r.LeaseUntil)
		steps, err := DecodeSteps(r.Steps)
		if err != nil {
			return engine.Record{}, err
		}
		rec.Steps = steps
		return rec, nil
	}
	h, err := DecodeHeader(r.Headers)
	if err != nil {
		return engine.Record{}, err
	}
	body := r.Body
	if body == nil {
		body = []byte{}
	}
	rec.Response = &engine.Response{Status: int(r.Status), Header: h, Body: body, BodyOmitted: r.BodyOmitted}
	return rec, nil
}

// Micros converts a duration that is not negative to microseconds: every
// duration fits, and a time in microseconds plus the longest duration
// (292 years) stays far from overflowing.
func Micros(d time.Duration) int64 { return max(d, 0).Microseconds() }

// FromMicros converts microseconds back to a duration, saturating.
func FromMicros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// AddDur is a + b for durations that are not negative, saturated.
func AddDur(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// MaxStatus is the largest status a Store keeps.
const MaxStatus = 65535

// CheckStatus refuses a status outside what a Store keeps.
func CheckStatus(resp *engine.Response) error {
	if resp.Status < 0 || resp.Status > MaxStatus {
		return fmt.Errorf("status %d out of range: %w", resp.Status, engine.ErrNotStorable)
	}
	return nil
}
