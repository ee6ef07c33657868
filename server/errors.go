package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/wire"
)

// Conditions the middleware answers itself, for applications that write
// their own answers with [WithErrorWriter]. Match them with errors.Is; the
// error passed to an [ErrorWriter] is an [*Error] that wraps one of them.
var (
	// ErrMissingKey: a protected request came without a key while keys are
	// required (400).
	ErrMissingKey = errors.New("idempotency key missing")
	// ErrInvalidKey: the key is empty, longer than 255 bytes (code
	// key_too_long), has a character outside printable ASCII, is a
	// malformed structured-field string, or is refused by [WithKeyFormat]
	// (400).
	ErrInvalidKey = errors.New("idempotency key invalid")
	// ErrBodyTooLarge: the request body is over the limit; the handler did
	// not run (413).
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrBodyUnreadable: the request body could not be read to its end (a
	// broken connection, a body shorter than its Content-Length, a failing
	// decoder); nothing was claimed and the handler did not run (400).
	ErrBodyUnreadable = errors.New("request body unreadable")
	// ErrUnidentified: the scope or fingerprint function failed, so the
	// request could not be identified (400).
	ErrUnidentified = errors.New("request could not be identified")
)

// problemBase is where each problem type is documented.
const problemBase = wire.ProblemBase

// Error is a refusal by the middleware: what an [ErrorWriter] receives. It wraps
// one of the Err... sentinels and, for a store failure, the store's error.
type Error struct {
	// Status is the HTTP status code to answer with.
	Status int
	// Type is the RFC 9457 problem type URI.
	Type string
	// Title is a short, fixed summary of the problem type.
	Title string
	// Detail explains this occurrence.
	Detail string
	// Code is the problem's stable, machine-readable name, sent as the
	// "code" member: key_missing, key_invalid, key_too_long, ... (the
	// table in the package documentation lists them all). Unlike Detail it
	// never changes between releases, so clients can match it.
	Code string
	// RetryAfter, when positive, is sent as the Retry-After header.
	RetryAfter time.Duration

	kind  error // one of the sentinels
	cause error // the store's error, if any; never shown to the client
}

func (e *Error) Error() string {
	if e.cause != nil {
		return "server: " + e.kind.Error() + ": " + e.cause.Error()
	}
	return "server: " + e.kind.Error()
}

// Unwrap returns the sentinel and, for a store failure, the store's error.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// refusal is how the middleware answers one of its sentinels.
type refusal struct {
	status int
	anchor string // the sentinel's name: the problem type's fragment
	title  string
}

// refusals is every answer the middleware writes itself, by sentinel.
var refusals = map[error]refusal{
	ErrMissingKey:              {http.StatusBadRequest, "ErrMissingKey", "Idempotency key missing"},
	ErrInvalidKey:              {http.StatusBadRequest, "ErrInvalidKey", "Idempotency key invalid"},
	ErrUnidentified:            {http.StatusBadRequest, "ErrUnidentified", "Request not identified"},
	ErrBodyUnreadable:          {http.StatusBadRequest, "ErrBodyUnreadable", "Request body unreadable"},
	ErrBodyTooLarge:            {http.StatusRequestEntityTooLarge, "ErrBodyTooLarge", "Request body too large"},
	engine.ErrKeyMismatch:      {http.StatusUnprocessableEntity, "ErrKeyMismatch", "Idempotency key reused"},
	engine.ErrInFlight:         {http.StatusConflict, "ErrInFlight", "Request in flight"},
	engine.ErrStoreUnavailable: {http.StatusServiceUnavailable, "ErrStoreUnavailable", "Idempotency store unavailable"},
	engine.ErrOutcomeUnknown:   {http.StatusConflict, "ErrOutcomeUnknown", "Outcome unknown"},
}

// codes is the code member of each sentinel's problem, kept apart from
// refusals so that adding a refusal is one line in each. A key over 255
// bytes is an ErrInvalidKey with its own code, wire.CodeKeyTooLong.
var codes = map[error]string{
	ErrMissingKey:              wire.CodeKeyMissing,
	ErrInvalidKey:              wire.CodeKeyInvalid,
	ErrUnidentified:            wire.CodeUnidentified,
	ErrBodyUnreadable:          wire.CodeBodyUnreadable,
	ErrBodyTooLarge:            wire.CodeBodyTooLarge,
	engine.ErrKeyMismatch:      wire.CodeKeyMismatch,
	engine.ErrInFlight:         wire.CodeInFlight,
	engine.ErrStoreUnavailable: wire.CodeStoreUnavailable,
	engine.ErrOutcomeUnknown:   wire.CodeOutcomeUnknown,
}

// problem makes the refusal of kind, one of the sentinels, with detail to
// explain this occurrence and cause, if any, behind it (never shown to the
// client).
func problem(kind error, detail string, cause error) *Error {
	r := refusals[kind]
	return &Error{Status: r.status, Type: problemBase + r.anchor, Title: r.title, Detail: detail, Code: codes[kind], kind: kind, cause: cause}
}

// An ErrorWriter answers a request that the middleware refuses. err is an
// *Error.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, err error)

// WriteProblem is the default [ErrorWriter]: it answers with an RFC 9457
// application/problem+json body, with the problem's code as the "code"
// extension member, and Retry-After when the error has one:
//
//	{"type":"https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrInFlight",
//	 "title":"Request in flight","status":409,"code":"in_flight","detail":"..."}
//
// The store's own error is never shown to the client. An error that is not
// an *Error is answered 500, without a code.
func WriteProblem(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Type: "about:blank", Title: "Internal Server Error"}
	}
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Code   string `json:"code,omitempty"`
		Detail string `json:"detail,omitempty"`
	}{e.Type, e.Title, e.Status, e.Code, e.Detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	w.Write(body)
}

// retryAfterSeconds rounds d up to whole seconds, at least one. It divides
// before it rounds, so that the largest durations do not overflow.
func retryAfterSeconds(d time.Duration) string {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++ // d + time.Second - 1 would overflow near math.MaxInt64
	}
	return strconv.FormatInt(max(s, 1), 10)
}
