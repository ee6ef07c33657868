package webhook

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// delivery is one verified delivery, from its claim to its answer: the
// webhook door of the engine.
type delivery struct {
	call engine.Call
	rc   *Receiver
	w    http.ResponseWriter
	r    *http.Request
	next http.Handler
	body []byte
	rec  recorder
}

var _ engine.Door = (*delivery)(nil)

// Replay answers a duplicate of a delivery that is done: its kept status,
// at once, without a body.
func (d *delivery) Replay(resp *engine.Response) int {
	h := d.w.Header()
	if resp.OutcomeUnknown() {
		// Not a 409: the sender retries the 500, and the delivery shows
		// as failing until an operator resolves the key.
		h.Set(engine.HeaderOutcome, "unknown")
		d.w.WriteHeader(http.StatusInternalServerError)
		return http.StatusInternalServerError
	}
	status := resp.Status
	if status < 200 || status > 999 {
		// Not a status this door keeps: a broken store's record.
		status = http.StatusInternalServerError
	}
	h.Set("Idempotent-Replayed", "true")
	d.w.WriteHeader(status)
	return status
}

// Refuse answers 503 with Retry-After: the delivery is still in flight
// after the wait, or the store failed. The sender retries either. The
// handler's headers, if it ran, stay in the recorder.
func (d *delivery) Refuse(kind error, retryAfterDur time.Duration, cause error) int {
	status := http.StatusServiceUnavailable
	if kind == engine.ErrKeyMismatch {
		// Every delivery has one fingerprint, so no store that this door
		// alone writes says so; answered as a failure the sender
		// retries, not as a 409 or a 422 it would count against the
		// endpoint for days.
		d.rc.engine.Logger().LogAttrs(d.r.Context(), slog.LevelError, "webhook: the store holds another request under this delivery id; answering 500",
			slog.String("scope", d.rc.scope), slog.String("key", d.call.Lease().Key))
		status = http.StatusInternalServerError
	} else {
		d.w.Header().Set("Retry-After", retryAfter(retryAfterDur))
	}
	http.Error(d.w, http.StatusText(status), status)
	return status
}

// Execute runs the handler into the recorder, and says what to keep.
func (d *delivery) Execute(ctx context.Context) engine.Outcome {
	r := d.r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(d.body))
	d.rec = recorder{w: d.w, header: make(http.Header)}
	d.next.ServeHTTP(&d.rec, r)
	rec := &d.rec
	status := rec.finalStatus()
	switch {
	case !rec.wrote() && ctx.Err() != nil:
		return engine.Outcome{Reason: "the handler returned without an answer after its context ended", Cause: context.Cause(ctx)}
	case rec.invalid:
		return engine.Outcome{Status: status, Reason: "the handler wrote an invalid status code", Sent: rec.streaming}
	case !d.rc.kept(d.r.Context(), status):
		return engine.Outcome{Status: status, Reason: "status " + strconv.Itoa(status) + " is not kept", Sent: rec.streaming}
	case rec.streaming:
		return engine.Outcome{Response: &engine.Response{Status: status}, Status: status, Sent: true}
	default:
		return engine.Outcome{Response: &engine.Response{Status: status}, Status: status}
	}
}

// Send sends the handler's answer, kept in the recorder. With now, the
// store write goes on on this goroutine after it, so the answer goes out
// whole at once: with its length, flushed, and, on HTTP/1, closing the
// connection, so that the sender's next delivery does not wait on it.
func (d *delivery) Send(now bool) {
	if !now {
		d.rec.send()
		return
	}
	h := d.rec.header
	if d.r.ProtoMajor == 1 {
		h.Set("Connection", "close")
	}
	if status := d.rec.finalStatus(); status != http.StatusNoContent && status != http.StatusNotModified &&
		h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" {
		// Without it, the sender reads the body until the connection
		// closes: after the store write.
		h.Set("Content-Length", strconv.Itoa(len(d.rec.body)))
	}
	d.rec.send()
	// A writer that cannot flush (a wrapper that hides it) sends the
	// answer when the handler returns: nothing better can be done.
	_ = http.NewResponseController(d.w).Flush()
}

// OutcomeUnknown records the answer of a delivery whose earlier holder was
// lost, under engine.RefuseAbandoned: a 500 that the sender retries, marked
// "Idempotent-Outcome: unknown", until an operator resolves the key.
func (d *delivery) OutcomeUnknown() *engine.Response {
	d.rec = recorder{w: d.w, header: make(http.Header), status: http.StatusInternalServerError}
	d.rec.header.Set(engine.HeaderOutcome, "unknown")
	return &engine.Response{Status: http.StatusInternalServerError, Header: map[string][]string{engine.HeaderOutcome: {"unknown"}}}
}

// Unprotected runs the handler without protection (engine.Config.FailOpen).
func (d *delivery) Unprotected() {
	d.r.Body = io.NopCloser(bytes.NewReader(d.body))
	d.next.ServeHTTP(d.w, d.r)
}

// maxKept is the most of a handler's answer that is held until its record
// is stored; past it the answer streams to the sender. Senders read a
// status and ignore the body.
const maxKept = 64 << 10

// recorder holds the handler's answer until its record is stored, so that
// the sender never gets a 2xx for a delivery whose record could not be
// written (the engine answers 503 instead). Its headers are its own until
// it sends them: a refusal carries none of them.
type recorder struct {
	w         http.ResponseWriter
	header    http.Header
	status    int
	body      []byte
	streaming bool
	sent      bool
	invalid   bool // the handler wrote a status code outside 100-999
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// net/http panics on such a code, and the sender retries the
		// aborted delivery. Left for the answer to default to 200, it
		// would be kept, and the delivery lost: it is answered 500, and
		// its key released.
		rec.invalid = true
		if !rec.streaming {
			rec.status = http.StatusInternalServerError
		}
		return
	}
	if rec.status != 0 || code < 200 {
		// Informational answers are dropped.
		return
	}
	rec.status = code
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.streaming {
		return rec.w.Write(p)
	}
	if len(rec.body)+len(p) > maxKept {
		rec.streaming = true
		rec.send()
		return rec.w.Write(p)
	}
	rec.body = append(rec.body, p...)
	return len(p), nil
}

// wrote reports whether the handler answered anything.
func (rec *recorder) wrote() bool { return rec.status != 0 }

// finalStatus is the status the answer goes out with: 200 when the handler
// wrote nothing, as net/http does.
func (rec *recorder) finalStatus() int {
	if rec.status == 0 {
		return http.StatusOK
	}
	return rec.status
}

// send writes the held answer to the sender, once.
func (rec *recorder) send() {
	if rec.sent {
		return
	}
	rec.sent = true
	maps.Copy(rec.w.Header(), rec.header)
	rec.w.WriteHeader(rec.finalStatus())
	if len(rec.body) > 0 {
		rec.w.Write(rec.body)
		rec.body = nil
	}
}
