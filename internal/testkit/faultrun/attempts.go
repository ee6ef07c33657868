package faultrun

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"

	"github.com/idemkit/idempotency"
)

// attemptLog is the RoundTripper under a run's idempotency.Client: it sees
// every attempt the client makes, and counts what came of it.
type attemptLog struct {
	base http.RoundTripper

	mu      sync.Mutex
	answers map[string]int
}

func newAttemptLog(base http.RoundTripper) *attemptLog {
	return &attemptLog{base: base, answers: map[string]int{}}
}

func (l *attemptLog) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(req)
	a := classify(req.Context(), resp, err)
	l.mu.Lock()
	l.answers[a]++
	l.mu.Unlock()
	return resp, err
}

func (l *attemptLog) snapshot() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]int, len(l.answers))
	for k, v := range l.answers {
		m[k] = v
	}
	return m
}

// Names of what an attempt can come to, other than a status.
const (
	answerTimeout  = "timeout"   // the attempt timeout passed
	answerReset    = "reset"     // connection reset
	answerClosed   = "no answer" // connection closed without a response
	answerError    = "error"     // any other transport error
	answerCanceled = "canceled"  // the caller's own context ended
)

// classify names what one attempt came to: its status (with "replayed" for
// a replay), or the kind of transport error.
func classify(ctx context.Context, resp *http.Response, err error) string {
	if err == nil {
		s := strconv.Itoa(resp.StatusCode)
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			s += " replayed"
		}
		return s
	}
	switch {
	case errors.Is(context.Cause(ctx), idempotency.ErrAttemptTimeout), errors.Is(err, idempotency.ErrAttemptTimeout):
		return answerTimeout
	case ctx.Err() != nil:
		return answerCanceled
	case errors.Is(err, syscall.ECONNRESET):
		return answerReset
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return answerClosed
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return answerTimeout
	}
	return answerError
}
