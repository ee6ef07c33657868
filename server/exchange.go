package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// exchange is one protected request, from its claim to its answer: the
// HTTP door of the engine. It holds everything the request needs, the
// engine's Call included, in one allocation.
type exchange struct {
	call       engine.Call
	m          *Middleware
	w          http.ResponseWriter
	r          *http.Request
	next       http.Handler
	id         engine.ID
	echo       [1]string     // the key header's value on the response
	body       []byte        // the whole request body, read before the claim
	capture    recorder      // the handler's response, kept until stored
	bodyReader bodyReader    // the handler's r.Body, over body
	kept       *keptResponse // the fingerprint, and room for the response
	// before holds the response headers as they were before the handler
	// ran, for a Binder's store: only its Complete can undo the handler's
	// work, and its refusal must then carry none of the handler's headers
	// (a cookie, a Location).
	before   http.Header
	executed bool // the handler ran (Execute)
	unknown  bool // the "outcome unknown" answer is in capture
	// inline holds a small request body, so that reading one allocates
	// nothing of its own. Nothing stored refers to it: the store keeps
	// the body's fingerprint, never the body.
	inline [inlineBody]byte
}

var _ engine.Door = (*exchange)(nil)

// inlineBody is the largest request body (less one byte, read to see its
// end) that the exchange holds in its own allocation.
const inlineBody = 2048

// bodyReader gives the handler the body the middleware read.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// Replay answers with a stored response.
func (ex *exchange) Replay(resp *engine.Response) int {
	ex.replay(resp)
	return resp.Status
}

// Refuse answers with the problem of kind.
func (ex *exchange) Refuse(kind error, retryAfter time.Duration, cause error) int {
	var e *Error
	switch kind {
	case engine.ErrInFlight:
		e = problem(engine.ErrInFlight, "A request with this idempotency key is still being processed; retry later.", nil)
	case engine.ErrKeyMismatch:
		e = problem(engine.ErrKeyMismatch, "This idempotency key was already used for a different request.", nil)
	default:
		e = problem(engine.ErrStoreUnavailable, "The request could not be protected against duplicates, so it was not processed; retry later.", cause)
		if ex.unknown {
			delete(ex.w.Header(), engine.HeaderOutcome)
		}
		if ex.executed {
			// The handler ran, and its answer is not sent: none of
			// its headers or its deadline change must reach the
			// refusal where they could be undone.
			if ex.before != nil {
				h := ex.w.Header()
				clear(h)
				maps.Copy(h, ex.before)
			}
			ex.capture.restoreDeadline()
		}
	}
	if kind != engine.ErrKeyMismatch {
		e.RetryAfter = retryAfter
	}
	ex.m.refuse(ex.w, ex.r, e)
	return e.Status
}

// Unprotected runs the handler without protection (engine.Config.FailOpen).
func (ex *exchange) Unprotected() {
	ex.r.Body = ex.requestBody()
	ex.next.ServeHTTP(ex.w, ex.r)
}

func (ex *exchange) requestBody() io.ReadCloser {
	if ex.body == nil {
		return http.NoBody
	}
	ex.bodyReader.Reset(ex.body)
	return &ex.bodyReader
}

// Execute runs the handler into the recorder, and says what to store of
// its response.
func (ex *exchange) Execute(ctx context.Context) engine.Outcome {
	m := ex.m
	r := ex.r.WithContext(ctx)
	r.Body = ex.requestBody()
	ex.capture = recorder{w: ex.w, limit: m.cfg.maxStored}
	if m.binder {
		ex.before = ex.w.Header().Clone()
	}
	ex.executed = true
	ex.next.ServeHTTP(&ex.capture, r)
	ex.capture.returned()

	rec := &ex.capture
	status := rec.finalStatus()
	switch {
	case !rec.wrote() && ctx.Err() != nil:
		// The handler gave up without an answer because its context
		// ended: the client went away, or the lease could not be kept.
		return engine.Outcome{Reason: "the handler returned without an answer after its context ended", Cause: context.Cause(ctx)}
	case !m.keeps(ex.r.Context(), status):
		return engine.Outcome{Status: status, Reason: "status " + strconv.Itoa(status) + " is not stored", Sent: rec.streaming}
	case rec.streaming:
		how := "streamed"
		if rec.hijacked {
			how = "hijacked"
		}
		m.engine.Logger().LogAttrs(ex.r.Context(), slog.LevelInfo, "idempotent response passed through; storing it without its body",
			slog.String("key", ex.id.Key), slog.Int("status", status), slog.String("how", how))
		return engine.Outcome{Response: ex.response(status, nil, true), Status: status, Sent: true}
	default:
		return engine.Outcome{Response: ex.response(status, rec.body, false), Status: status}
	}
}

// Send sends the kept response. With now, the client's next request must
// not wait on this connection while the store write goes on on this
// goroutine (HTTP/2 multiplexes: nothing waits there).
func (ex *exchange) Send(now bool) {
	if !now {
		ex.capture.send()
		return
	}
	if ex.r.ProtoMajor == 1 {
		ex.w.Header().Set("Connection", "close")
	}
	ex.capture.sendNow()
}

// OutcomeUnknown writes the "outcome unknown" answer into the recorder and
// returns the record of it.
func (ex *exchange) OutcomeUnknown() *engine.Response {
	m := ex.m
	e := problem(engine.ErrOutcomeUnknown, "An earlier attempt at this request was interrupted and whether it took effect is unknown; this answer is final. Do not retry with this key: check the outcome, or ask the operator to resolve the key.", nil)
	ex.w.Header().Set(engine.HeaderOutcome, "unknown")
	ex.unknown = true
	rec := &ex.capture
	*rec = recorder{w: ex.w, limit: math.MaxInt}
	m.refuseHeld(rec, ex.r, e)
	h := ex.keptHeader()
	if h == nil {
		h = make(http.Header, 1)
	}
	h.Set(engine.HeaderOutcome, "unknown")
	return &engine.Response{Status: rec.finalStatus(), Header: h, Body: rec.body}
}
