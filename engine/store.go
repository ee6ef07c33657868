package engine

import (
	"context"
	"errors"
	"time"
)

// ID addresses one idempotency record: the key the client sent, within the
// scope of the caller that sent it. Two callers that happen to choose the same
// key never share a record because their scopes differ.
type ID struct {
	// Scope identifies the caller (a tenant, an account, a hash of its
	// credentials). It may be empty, for an API with a single caller.
	Scope string
	// Key is the client's idempotency key, already unquoted and validated.
	Key string
}

// Token is a fencing token: a number that a Store hands out with every lease
// it grants. For a given ID, each lease granted gets a token larger than every
// token granted before it for that ID (after a release, a takeover or an
// expiry alike), so a holder whose lease was lost can be recognised and
// refused, by the Store and by any downstream system the handler passes the
// token to.
type Token int64

// ClaimStatus says what a Claim found.
type ClaimStatus int

const (
	// Acquired means the caller now holds the lease for the ID and must run
	// the request, then Complete or Release it with Claim.Token.
	Acquired ClaimStatus = iota + 1
	// InFlight means another holder's lease is live: the request is being
	// run elsewhere. Claim.Fingerprint and Claim.RetryAfter are set.
	InFlight
	// Completed means the request ran and its response is stored:
	// Claim.Fingerprint and Claim.Response are set.
	Completed
)

// String returns the status's name.
func (s ClaimStatus) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case InFlight:
		return "in flight"
	case Completed:
		return "completed"
	}
	return "unknown"
}

// Claim is the answer of Store.Claim.
type Claim struct {
	// Status says which of the other fields are set.
	Status ClaimStatus
	// Token is the new lease's fencing token (Acquired).
	Token Token
	// Fingerprint is the fingerprint stored with the record (InFlight and
	// Completed), so that the caller can refuse a key reused for another
	// request. It may be empty for InFlight when the store cannot see it yet
	// (a transactional store whose original has not committed); the
	// middleware then treats the request as the same one.
	Fingerprint string
	// RetryAfter is how long the current lease has left (InFlight). It is
	// zero when the lease has expired but the record could not be taken over
	// because the fingerprints differ.
	RetryAfter time.Duration
	// Response is the stored response (Completed).
	Response *Response
	// Abandoned is, for Acquired, how many holders of this record came
	// before this one and lost their lease without completing or releasing
	// it (their process died, hung, or lost its store): 0 for a new record,
	// 1 for the first takeover of an expired lease, 2 for the next, and so
	// on. Holders that released the record are not counted, and do not
	// make the count forget the lost holders before them (see
	// Store.Release). An abandoned holder may have done its work before it
	// was lost: a request acquired with Abandoned > 0 must look for its own
	// effect before doing it again, or be refused.
	Abandoned int
	// Steps holds, for Acquired, the steps that earlier holders recorded
	// (a StepStore only): nil for a new record.
	Steps []Step
}

// Response is a stored result, as a door replays it: for the HTTP
// middleware an HTTP response, for other doors their own result in the same
// shape (the function door's encoded value, a gRPC response message).
type Response struct {
	// Status is the door's status: the HTTP status code for the
	// middleware, the gRPC code for the gRPC door. A Store keeps any value
	// from 0 to 65535.
	Status int
	// Header holds the headers to replay, in http.Header's shape (an
	// http.Header converts to it, and back). The HTTP middleware stores only
	// headers on its allow-list; a Store keeps them exactly, including the
	// order of values and binary-safe bytes.
	Header map[string][]string
	// Body is the response body, byte for byte.
	Body []byte
	// BodyOmitted records that the handler ran but its body was not stored:
	// it was larger than the stored-response limit, or the handler streamed
	// or hijacked the connection. The record still guarantees that the
	// request is not run again; its replay carries the status and headers
	// and says that the body was omitted.
	BodyOmitted bool
}

// Size is an estimate, in bytes, of the memory and storage a Response takes.
func (r *Response) Size() int {
	n := len(r.Body) + 16
	for k, vs := range r.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

// ErrNotStorable is returned, wrapped, by Store.Complete when the store will
// never accept this response, so that another try cannot succeed: it is
// larger than one record can hold, or the store refuses its bytes. Each
// Store documents which of its errors wrap it. The engine then records
// the request as done without its body (Response.BodyOmitted), so that it is
// never run again.
var ErrNotStorable = errors.New("idempotent response cannot be stored")

// ErrStoreClosed is what a Store's error wraps when the Store was closed
// and will never answer again. A response that could not be stored before
// then is not tried again: its record went with the store. The middleware
// also recognises it in the late Complete, so that Shutdown does not wait a
// lease for a store that is gone.
var ErrStoreClosed = errors.New("idempotency store closed")

// ErrNotFound is returned, wrapped, by Inspector.Lookup and
// Inspector.Resolve when no live record exists for the ID.
var ErrNotFound = errors.New("idempotency record not found")

// ErrNotCommitted is returned, wrapped, by Store.Complete when a store that
// runs the handler's effects in its own transaction (a Binder) could not
// commit them: they were rolled back, or whether they were is unknown. The
// middleware then answers 503 instead of the handler's response, so that the
// client retries: the retry replays the response if the transaction did
// commit, and runs the request again if it did not.
var ErrNotCommitted = errors.New("idempotent request not committed")

// ErrLeaseLost is returned, wrapped, by Store.Complete, Store.Release and
// Store.Extend when the token is not the record's current one: the lease
// expired and was taken over, or the record was released, completed or
// expired. Nothing was changed.
var ErrLeaseLost = errors.New("idempotency lease lost")

// Store keeps idempotency records. Every method is one atomic operation on one
// record, so that several instances of an API sharing a Store never run a
// request twice; each is designed to be one round trip to a database.
//
// Errors other than ErrLeaseLost are reserved for system failures (the store
// is unreachable, a query failed, a record cannot be decoded). The middleware
// answers them with 503 and never runs the handler unprotected unless it was
// told to fail open.
//
// Every method must return once its context is done (its deadline passed):
// the engine bounds each call with its store timeout, on a context that
// the client's disconnect does not cancel, and answers 503 when that passes.
//
// A Store must be safe for concurrent use. Run the conformance suite,
// storetest.Run, against any implementation.
type Store interface {
	// Claim atomically asks for the lease on id.
	//
	// When no live record exists (none was stored, it expired, or it was
	// released by a holder that had created it) Claim creates one in
	// flight with the given fingerprint, a lease that ends after lease and
	// a record that expires ttl after the lease ends, and returns Acquired
	// with a new token.
	//
	// When a record is in flight and its lease is live, Claim returns
	// InFlight. When its lease has expired and the fingerprints are equal,
	// the caller takes it over: Claim grants a new lease with a new token and
	// returns Acquired; the old holder's token is refused from then on. When
	// the lease has expired but the fingerprints differ, Claim returns
	// InFlight with RetryAfter zero, so that the caller refuses the request.
	//
	// When the record is completed, Claim returns Completed with the stored
	// fingerprint and response, whatever the fingerprint given.
	//
	// An in-flight record outlives every lease that holds it by ttl: the
	// holder may have done its work until its lease's end, so a retry
	// after that, within the TTL, must find the record and be told of the
	// lost holder (Claim.Abandoned), whatever the lease and the TTL, and
	// however often the lease was extended. Sums of durations saturate.
	Claim(ctx context.Context, id ID, fingerprint string, lease, ttl time.Duration) (Claim, error)

	// Complete stores resp as the record's response, ends the lease and
	// makes the record expire after ttl. It fails with ErrLeaseLost unless
	// token is the record's current token and the record is in flight. The
	// Store may keep resp: the caller must not modify it afterwards, and
	// callers of Claim must not modify the Response it returns.
	Complete(ctx context.Context, id ID, token Token, resp *Response, ttl time.Duration) error

	// Release gives the lease up without storing a response: the holder
	// did nothing that must be kept, and the next Claim for id with the
	// same fingerprint is Acquired (with a larger token). It undoes the
	// Claim that granted the lease. A record that Claim created is
	// deleted: the key is new again, for any fingerprint. A record that
	// Claim took over from lost holders (Claim.Abandoned > 0) goes back to
	// how that Claim found it: in flight, its lease over, the lost holders
	// counted as before (Inspector.Lookup reports it so), its expiry kept.
	// The next Claim with the same fingerprint takes it over at once and
	// gets the same Abandoned as the holder that released it, and one with
	// another fingerprint is refused (InFlight, RetryAfter zero): the lost
	// holders may have done the work, so a release must neither forget
	// them nor make the key new. Either way the releasing holder's token is
	// refused from then on. Release fails with ErrLeaseLost unless token is
	// the record's current token and the record is in flight.
	Release(ctx context.Context, id ID, token Token) error

	// Extend renews the lease so that it ends after lease from now, and
	// keeps the record at least ttl (Claim's) after that end. It fails
	// with ErrLeaseLost unless token is the record's current token and the
	// record is in flight (an expired lease that nobody has taken over yet
	// may still be extended).
	Extend(ctx context.Context, id ID, token Token, lease time.Duration) error
}

// Binder is implemented by a Store whose lease carries state that the handler
// needs, such as the database transaction of pgstore's transactional mode.
// After a claim is Acquired the engine runs the handler with the context
// that Bind returns.
//
// The engine then calls Complete or Release for that lease on every path,
// a panicking handler included, after the handler has returned and before the
// client sees the response; a Complete that fails with ErrNotCommitted makes
// it answer 503. Extend may run concurrently with the handler and with
// Complete or Release, so a Binder must not touch the bound state there.
type Binder interface {
	Bind(ctx context.Context, id ID, token Token) context.Context
}

// Record is what Inspector.Lookup reports of one record, for an operator who
// must decide what became of a request.
type Record struct {
	ID ID
	// Completed reports that the record holds a response (Response is set);
	// otherwise it is in flight.
	Completed bool
	// Fingerprint is the fingerprint of the request that claimed the record.
	Fingerprint string
	// Token is the current (or last) holder's fencing token.
	Token Token
	// Abandoned counts the holders that lost their lease without completing
	// or releasing the record, as in Claim.Abandoned; a record in flight
	// whose lease has ended has lost one more, which its takeover counts.
	// A record released by a holder that took it over is reported as that
	// takeover found it: in flight, its lease over.
	Abandoned int
	// Created is when the record was first claimed, by the store's clock.
	Created time.Time
	// LeaseEnds is when the current holder's lease ends (in flight). A time
	// in the past means the holder was lost and no request has taken the
	// record over yet.
	LeaseEnds time.Time
	// Expires is when the record will be forgotten.
	Expires time.Time
	// Response is the stored response (Completed).
	Response *Response
	// Steps holds the steps recorded under the record (in flight, in a
	// StepStore).
	Steps []Step
}

// Inspector is implemented by a Store that lets an operator look a record up
// and settle it by hand: the answer to "did this request happen?" when the
// middleware could not tell (a holder abandoned after its effect, an outcome
// recorded as unknown). memstore, pgstore and redisstore implement it.
type Inspector interface {
	// Lookup returns the record for id, or an error wrapping ErrNotFound
	// when there is none (it was never claimed, was released by the holder
	// that created it, or expired).
	Lookup(ctx context.Context, id ID) (Record, error)

	// Resolve settles the record for id, in flight or completed, whatever
	// its lease. With resp set, it stores resp as the record's response and
	// makes the record expire after ttl: the request is recorded as done
	// and resp is replayed to every retry. With resp nil, it deletes the
	// record, so that the next request with the key runs. Either way a
	// holder still running loses its lease: its token is refused from then
	// on. It fails with an error wrapping ErrNotFound when there is no
	// record.
	Resolve(ctx context.Context, id ID, resp *Response, ttl time.Duration) error
}
