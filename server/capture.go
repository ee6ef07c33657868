package server

import (
	"bufio"
	"maps"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// recorder is the ResponseWriter the handler writes to. It keeps the response
// so that it can be stored before the client sees any of it: a client must
// never receive an answer for which the store holds no record.
//
// When the handler flushes, hijacks the connection or writes more than the
// stored-response limit, the recorder becomes a pass-through from then on
// (streaming): the response goes straight to the client and only its status
// and headers are stored.
type recorder struct {
	w         http.ResponseWriter
	limit     int
	status    int
	body      []byte
	streaming bool
	hijacked  bool
	// The write deadline the handler set, and when the handler returned:
	// the store write after the handler must not spend the handler's
	// deadline, so the response is sent under the deadline shifted by it.
	deadline    time.Time
	deadlineSet bool
	returnedAt  time.Time
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)

func (rec *recorder) Header() http.Header { return rec.w.Header() }

func (rec *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// net/http panics on such a code; it must not be kept as the
		// response instead, stored, and then fail every replay for the
		// TTL (or, for 0, be stored as a 200 never written). The panic
		// comes from the writer, as it would without the middleware, and
		// releases the key like a handler's.
		rec.w.WriteHeader(code)
		return
	}
	if rec.status != 0 || rec.hijacked {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses, such as 103 Early Hints, are not the
		// response: send them on.
		rec.w.WriteHeader(code)
		return
	}
	rec.status = code
	if rec.streaming {
		rec.w.WriteHeader(code)
	}
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.streaming {
		return rec.w.Write(p)
	}
	if len(rec.body)+len(p) > rec.limit {
		if err := rec.stream(); err != nil {
			return 0, err
		}
		return rec.w.Write(p)
	}
	if rec.body == nil {
		rec.body = make([]byte, 0, max(len(p), 512))
	}
	rec.body = append(rec.body, p...)
	return len(p), nil
}

// stream switches to pass-through, sending what was kept so far.
func (rec *recorder) stream() error {
	if rec.streaming {
		return nil
	}
	rec.streaming = true
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	rec.w.WriteHeader(rec.status)
	body := rec.body
	rec.body = nil
	if len(body) == 0 {
		return nil
	}
	_, err := rec.w.Write(body)
	return err
}

// Flush implements http.Flusher: a handler that flushes streams.
func (rec *recorder) Flush() { rec.FlushError() }

// FlushError is what http.ResponseController calls to flush.
func (rec *recorder) FlushError() error {
	if rec.hijacked {
		return http.ErrHijacked
	}
	if !rec.streaming && !canFlush(rec.w) {
		// Nothing can go out early (a wrapper outside hides Flush), so
		// the response stays kept, and is stored whole.
		return http.ErrNotSupported
	}
	if err := rec.stream(); err != nil {
		return err
	}
	return http.NewResponseController(rec.w).Flush()
}

// canFlush reports whether w, or a writer it unwraps to, can flush, as
// http.ResponseController looks for one.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Flusher, interface{ FlushError() error }:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// Hijack implements http.Hijacker. The hijacked exchange is not stored.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil {
		rec.hijacked = true
		rec.streaming = true
		rec.body = nil
	}
	return conn, rw, err
}

// Unwrap lets http.ResponseController reach the underlying writer for the
// features the recorder does not change (deadlines, full duplex).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// SetWriteDeadline is what http.ResponseController calls to set a write
// deadline. It is passed on at once, so that the handler learns whether the
// writer supports it; a kept response is sent under it again, shifted by the
// time the store took after the handler returned.
func (rec *recorder) SetWriteDeadline(t time.Time) error {
	err := http.NewResponseController(rec.w).SetWriteDeadline(t)
	if err == nil && !rec.streaming {
		rec.deadline, rec.deadlineSet = t, true
	}
	return err
}

// returned records that the handler returned.
func (rec *recorder) returned() {
	if rec.deadlineSet {
		rec.returnedAt = time.Now()
	}
}

// restoreDeadline gives the response the handler's write deadline again,
// from the moment the store let it go.
func (rec *recorder) restoreDeadline() {
	if !rec.deadlineSet || rec.deadline.IsZero() || rec.returnedAt.IsZero() {
		return
	}
	http.NewResponseController(rec.w).SetWriteDeadline(rec.deadline.Add(time.Since(rec.returnedAt)))
}

// wrote reports whether the handler answered at all.
func (rec *recorder) wrote() bool {
	return rec.status != 0 || rec.streaming || len(rec.body) > 0
}

// finalStatus is the status the handler answered with.
func (rec *recorder) finalStatus() int {
	if rec.status == 0 {
		return http.StatusOK
	}
	return rec.status
}

// send writes the kept response to the client.
func (rec *recorder) send() {
	rec.write(false)
}

// sendNow writes the kept response to the client and flushes it, with its
// length, so that the client has all of it while the handler's goroutine
// goes on working.
func (rec *recorder) sendNow() {
	rec.write(true)
	http.NewResponseController(rec.w).Flush()
}

// write sends the kept response: with an explicit Content-Length when
// net/http would not set one (a large body, or now, a response flushed
// before the request ends), unless the handler declared trailers, which go
// out after the body, as trailers, on a chunked (HTTP/1.1) or HTTP/2
// response.
func (rec *recorder) write(now bool) {
	rec.restoreDeadline()
	status := rec.finalStatus()
	h := rec.w.Header()
	trailers := rec.holdTrailers()
	length := needsLength(status, len(rec.body)) || (now && bodyAllowed(status))
	if length && trailers == nil && h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" {
		h.Set("Content-Length", strconv.Itoa(len(rec.body)))
	}
	rec.w.WriteHeader(status)
	if len(rec.body) > 0 {
		rec.w.Write(rec.body)
	}
	// Set after the header is written, a declared trailer is sent as one.
	maps.Copy(h, trailers)
}

// holdTrailers takes the values of the trailers the handler declared (in
// the Trailer header) out of the header, so that they are not sent before
// the body, and returns them; nil if there are none.
func (rec *recorder) holdTrailers() http.Header {
	h := rec.w.Header()
	var held http.Header
	for _, v := range h["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(textproto.TrimString(name))
			vs, ok := h[name]
			if !ok || name == "" {
				continue
			}
			if held == nil {
				held = make(http.Header, 1)
			}
			held[name] = vs
			delete(h, name)
		}
	}
	return held
}

// needsLength reports whether a response written in one piece needs an
// explicit Content-Length: net/http sets one itself for a body that fits its
// 2 KiB write buffer, and sends a larger one chunked unless told its length.
func needsLength(status, n int) bool {
	return n >= 2048 && bodyAllowed(status)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
