package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// attemptTransport is the RoundTripper of the Client's internal
// http.Clients. It checks the URL of every hop (a redirect can lead
// anywhere) and applies the attempt timeout. It deliberately has no
// CloseIdleConnections method: see newConfig.
type attemptTransport struct {
	base     http.RoundTripper
	cause    *attemptTimeoutError // immutable, shared by all attempts
	timeouts attemptTimeouts
}

var _ http.RoundTripper = (*attemptTransport)(nil)

func (t *attemptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := checkURL(req.URL); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	a := attemptOf(req.Context())
	if a == nil || !a.timed || !t.timeouts.start(a) {
		// No timeout, or the caller's deadline comes first and wins anyway.
		return t.base.RoundTrip(req)
	}
	resp, err := t.base.RoundTrip(req)
	inTime := t.timeouts.stop(a)
	if err != nil || resp == nil {
		// (No response and no error breaks the RoundTripper contract; the
		// http.Client says so.)
		if err != nil && a.timedOut() {
			err = t.cause
		}
		a.unlink()
		return nil, err
	}
	if !inTime {
		// The headers came as the time ran out: the context is, or is
		// about to be, canceled, so the body cannot be read.
		if resp.Body != nil {
			resp.Body.Close()
		}
		a.unlink()
		return nil, t.cause
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		a.unlink()
		return resp, nil
	}
	if !a.linked() {
		return resp, nil
	}
	// a passes the cancellation of the caller's context on to the
	// Transport until the body is read or closed; then it stops, so that
	// a long-lived caller's context does not keep it.
	if w, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = &attemptRWBody{attemptBody{rc: w, a: a}, w}
	} else {
		resp.Body = &attemptBody{rc: resp.Body, a: a}
	}
	return resp, nil
}

// attemptTimeouts cancels the attempts that wait for their response headers
// longer than the attempt timeout, with one timer for all the attempts of a
// Client. As every attempt gets the same time, the attempts expire in the
// order in which they started: they wait in a queue, and the timer is set
// for the first. Starting or ending an attempt does not touch the timer,
// which is set again only when it fires: setting a runtime timer for each
// attempt, which may wake the network poller, costs more than the rest of
// the attempt timeout together.
//
// The timer, made with the first attempt, is left to fire after the last:
// it holds no goroutine.
type attemptTimeouts struct {
	d time.Duration

	mu         sync.Mutex
	head, tail *attemptCtx // the attempts waiting, oldest first
	timer      *time.Timer
	armed      bool
}

// start puts a in the queue. It reports false if a is already there (two
// requests of one attempt at once; the second is not timed).
func (q *attemptTimeouts) start(a *attemptCtx) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if a.queued {
		return false
	}
	a.queued, a.expired = true, false
	// Read under the lock, so that the queue is in the order of deadlines.
	a.deadline = time.Now().Add(q.d)
	a.prev, a.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = a
	} else {
		q.head = a
	}
	q.tail = a
	if !q.armed {
		q.armed = true
		if q.timer == nil {
			q.timer = time.AfterFunc(q.d, q.fire)
		} else {
			q.timer.Reset(q.d)
		}
	}
	return true
}

// stop takes a out of the queue. It reports false if a's time ran out
// first: then a is, or is about to be, canceled.
func (q *attemptTimeouts) stop(a *attemptCtx) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !a.queued {
		return !a.expired
	}
	q.removeLocked(a)
	return true
}

func (q *attemptTimeouts) removeLocked(a *attemptCtx) {
	if a.prev != nil {
		a.prev.next = a.next
	} else {
		q.head = a.next
	}
	if a.next != nil {
		a.next.prev = a.prev
	} else {
		q.tail = a.prev
	}
	a.prev, a.next, a.queued = nil, nil, false
}

// fire cancels the attempts whose time has run out, and sets the timer for
// the next one to expire.
func (q *attemptTimeouts) fire() {
	var expired *attemptCtx // chained through next
	q.mu.Lock()
	now := time.Now()
	for q.head != nil && !now.Before(q.head.deadline) {
		a := q.head
		q.removeLocked(a)
		a.expired = true
		a.next, expired = expired, a
	}
	if q.head != nil {
		q.timer.Reset(q.head.deadline.Sub(now))
	} else {
		q.armed = false
	}
	q.mu.Unlock()
	for a := expired; a != nil; {
		next := a.next
		a.next = nil
		a.cancel(context.Canceled, true)
		a = next
	}
}

// attemptBody stops an attempt's context from following the caller's when
// the response body has been read to the end or closed.
type attemptBody struct {
	rc io.ReadCloser
	a  *attemptCtx
}

func (b *attemptBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		// net/http has already returned the connection to the pool.
		b.a.unlink()
	}
	return n, err
}

func (b *attemptBody) Close() error {
	err := b.rc.Close()
	b.a.unlink()
	return err
}

// attemptRWBody keeps the body of a 101 Switching Protocols response
// writable.
type attemptRWBody struct {
	attemptBody
	w io.Writer
}

func (b *attemptRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }

// checkURL reports whether u can be sent to: an absolute http or https URL
// with a host.
func checkURL(u *url.URL) error {
	switch {
	case u == nil:
		return fmt.Errorf("%w: no URL", ErrInvalidURL)
	case u.Scheme == "":
		return fmt.Errorf("%w %q: not absolute", ErrInvalidURL, u.Redacted())
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%w %q: scheme is not http or https", ErrInvalidURL, u.Redacted())
	case u.Host == "":
		return fmt.Errorf("%w %q: no host", ErrInvalidURL, u.Redacted())
	}
	return nil
}

// checkRedirect wraps a CheckRedirect policy (nil means net/http's: at most
// 10 redirects) so that its errors match ErrRedirect. http.ErrUseLastResponse
// passes unchanged, as it is not an error but an instruction.
func checkRedirect(policy func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		var err error
		if policy != nil {
			err = policy(req, via)
		} else if len(via) >= 10 {
			err = errors.New("stopped after 10 redirects")
		}
		if err == nil || err == http.ErrUseLastResponse {
			return err
		}
		return fmt.Errorf("%w: %w", ErrRedirect, err)
	}
}

// useLastResponse is the redirect policy of the Client's RoundTripper: a
// RoundTripper returns redirects to the http.Client that called it, which
// follows them with its own policy.
func useLastResponse(*http.Request, []*http.Request) error {
	return http.ErrUseLastResponse
}
