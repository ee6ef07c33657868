package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idempotency/server"
)

// idempotent runs the rest of gin's handler chain inside the idempotency
// middleware.
//
// The middleware is net/http middleware: it answers refusals and replays
// itself, and when it lets a request through it hands the next handler its
// own http.ResponseWriter, which keeps the response so that it is stored
// before the client sees it, and its own *http.Request, whose body it has
// read and replaced and whose context carries the lease. So the next handler
// here sets c.Request and c.Writer to them before c.Next(): a gin handler
// writes to c.Writer, and if c.Writer were still gin's own writer the
// middleware would see no response at all, store an empty 200 and replay
// that to every retry. (gin.WrapH(mw.Handler(h)) is correct too, for an h
// that is a plain http.Handler; this adapter keeps the handlers gin's.)
//
// When the middleware answers by itself the chain is aborted, so the
// handlers after this one do not run. c.Writer and c.Request are put back
// afterwards, panics included, so that the handlers before this one (a
// logger, gin.Recovery) see the response that was actually sent and write
// to it.
//
// Handlers should take their context from c.Request.Context(), not from c:
// the lease (engine.LeaseFromContext), the transaction of pgstore's
// transactional mode (pgstore.TxFromContext) and the cancellation that
// follows a lost lease are in the request's context, which *gin.Context
// reaches only when the engine's ContextWithFallback is set.
func idempotent(mw *server.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		sent, req := c.Writer, c.Request
		defer func() { c.Writer, c.Request = sent, req }()
		ran := false
		mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			rw := &responseWriter{ResponseWriter: w, gin: sent, status: http.StatusOK, size: noWritten}
			c.Writer, c.Request = rw, r
			c.Next()
			// gin writes the header of a response without a body
			// after the chain; here the chain ends before the
			// middleware stores the response.
			rw.WriteHeaderNow()
		})).ServeHTTP(sent, req)
		if !ran {
			c.Abort()
		}
	}
}

const noWritten = -1

// responseWriter is the gin.ResponseWriter of the handlers behind the
// middleware. It writes to the middleware's writer, with the bookkeeping of
// gin's own: the status is held until the first byte of the body (or
// WriteHeaderNow), so that the last status set before writing wins, as in
// gin.
type responseWriter struct {
	http.ResponseWriter                    // the middleware's
	gin                 gin.ResponseWriter // gin's own, for CloseNotify
	status              int
	size                int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(p)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *responseWriter) Status() int   { return w.status }
func (w *responseWriter) Size() int     { return w.size }
func (w *responseWriter) Written() bool { return w.size != noWritten }

// Flush sends what was written so far: the middleware then stores the
// response without its body (see server's doc, Replays).
func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection over, as gin's writer does, unless part of the
// body was written.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errors.New("cannot hijack: part of the response body was written")
	}
	if w.size < 0 {
		w.size = 0
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// CloseNotify is about the connection, which gin's writer knows.
func (w *responseWriter) CloseNotify() <-chan bool { return w.gin.CloseNotify() }

func (w *responseWriter) Pusher() http.Pusher {
	p, _ := w.ResponseWriter.(http.Pusher)
	return p
}

// Unwrap lets http.ResponseController reach the middleware's writer.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
