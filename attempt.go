package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// attemptTransport is the RoundTripper of the Client's internal
// http.Clients. It checks the URL of every hop (a redirect can lead
// anywhere) and applies the attempt timeout. It deliberately has no
// CloseIdleConnections method: see newConfig.
type attemptTransport struct {
	base    http.RoundTripper
	timeout time.Duration
	cause   *attemptTimeoutError // immutable, shared by all attempts
	timers  sync.Pool            // of *attemptTimer, stopped
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
	if a == nil || !a.timed {
		// No timeout, or the caller's deadline comes first and wins anyway.
		return t.base.RoundTrip(req)
	}

	timer, _ := t.timers.Get().(*attemptTimer)
	if timer == nil {
		timer = new(attemptTimer)
		timer.a.Store(a)
		timer.t = time.AfterFunc(t.timeout, timer.fire)
	} else {
		timer.a.Store(a)
		timer.t.Reset(t.timeout)
	}
	resp, err := t.base.RoundTrip(req)
	stopped := timer.t.Stop()
	if stopped {
		// fire will not run: the timer can serve another attempt.
		timer.a.Store(nil)
		t.timers.Put(timer)
	}
	// Otherwise fire has run or is running, and cancels a: the timer is
	// left to the garbage collector, so that it never cancels another.
	if err != nil {
		if a.timedOut() {
			err = t.cause
		}
		a.unlink()
		return nil, err
	}
	if !stopped {
		// The headers came as the timer fired: the context is, or is about
		// to be, canceled, so the body cannot be read.
		resp.Body.Close()
		a.unlink()
		return nil, t.cause
	}
	if resp.Body == http.NoBody {
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

// attemptTimer cancels the attempt it is armed for when the attempt
// timeout passes. A Client keeps the timers of finished attempts, stopped,
// for the next ones.
type attemptTimer struct {
	t *time.Timer
	a atomic.Pointer[attemptCtx]
}

func (at *attemptTimer) fire() {
	if a := at.a.Swap(nil); a != nil {
		a.cancel(context.Canceled, true)
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

// attemptCtx is the context of the requests of one attempt: the caller's
// context, which it follows, and which it also cancels (if it is timed)
// when the attempt timeout passes before the response headers arrive. Its
// Value method returns the call for callKey, so that OutcomeOf finds it
// from the response.
//
// It costs less than a context.WithCancelCause per attempt and the
// http.Request copy that goes with it: the first attempt's is part of the
// call, and it follows the caller's context only when that context can be
// canceled. net/http's Transport derives its own context from it through
// its AfterFunc method.
type attemptCtx struct {
	parent context.Context // the caller's
	call   *call
	timed  bool // has an attempt timeout: else all but Value is the parent's

	mu       sync.Mutex
	done     chan struct{} // made on demand
	err      error
	timeout  bool         // canceled by the attempt timeout
	funcs    []afterFunc  // to run when canceled
	inline   [1]afterFunc // funcs' first storage
	nextID   uint64
	unfollow func() bool // stops following the parent
}

type afterFunc struct {
	id uint64
	f  func()
}

type attemptKey struct{}

func (a *attemptCtx) init(parent context.Context, c *call, timeout, wait time.Duration) {
	a.parent, a.call = parent, c
	a.funcs = a.inline[:0]
	if timeout <= 0 {
		return
	}
	if deadline, ok := parent.Deadline(); ok && time.Until(deadline)-wait <= timeout {
		return
	}
	a.timed = true
}

// attemptOf returns the attemptCtx that ctx is or derives from, or nil.
func attemptOf(ctx context.Context) *attemptCtx {
	if a, ok := ctx.(*attemptCtx); ok {
		return a
	}
	a, _ := ctx.Value(attemptKey{}).(*attemptCtx)
	return a
}

func (a *attemptCtx) Deadline() (time.Time, bool) { return a.parent.Deadline() }

func (a *attemptCtx) Value(key any) any {
	switch key.(type) {
	case callKey:
		return a.call
	case attemptKey:
		return a
	}
	return a.parent.Value(key)
}

func (a *attemptCtx) Done() <-chan struct{} {
	if !a.timed {
		return a.parent.Done()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		a.done = make(chan struct{})
	}
	a.followLocked()
	return a.done
}

func (a *attemptCtx) Err() error {
	if !a.timed {
		return a.parent.Err()
	}
	a.mu.Lock()
	err := a.err
	a.mu.Unlock()
	if err == nil {
		if err = a.parent.Err(); err != nil {
			// Not waiting for the parent's AfterFunc to tell.
			a.cancel(err, false)
		}
	}
	return err
}

// AfterFunc arranges for f to run in its own goroutine when a is canceled,
// as context.AfterFunc does; the context package uses it to make the
// contexts derived from a follow it.
func (a *attemptCtx) AfterFunc(f func()) (stop func() bool) {
	if !a.timed {
		return context.AfterFunc(a.parent, f)
	}
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a.followLocked()
	a.nextID++
	id := a.nextID
	a.funcs = append(a.funcs, afterFunc{id: id, f: f})
	a.mu.Unlock()
	return func() bool { return a.stop(id) }
}

func (a *attemptCtx) stop(id uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, af := range a.funcs {
		if af.id == id {
			a.funcs = append(a.funcs[:i], a.funcs[i+1:]...)
			return true
		}
	}
	return false
}

// followLocked makes a follow its parent's cancellation, if the parent can
// be canceled and a does not follow it already.
func (a *attemptCtx) followLocked() {
	if a.unfollow != nil || a.err != nil || a.parent.Done() == nil {
		return
	}
	a.unfollow = context.AfterFunc(a.parent, a.parentDone)
}

func (a *attemptCtx) parentDone() {
	a.cancel(a.parent.Err(), false)
}

// linked reports whether a follows its parent.
func (a *attemptCtx) linked() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unfollow != nil
}

// unlink stops a from following its parent. A later Done or AfterFunc
// follows it again, as the next hop of a redirect does.
func (a *attemptCtx) unlink() {
	a.mu.Lock()
	stop := a.unfollow
	a.unfollow = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// cancel cancels a with err, and runs the functions given to AfterFunc.
func (a *attemptCtx) cancel(err error, timeout bool) {
	a.mu.Lock()
	if a.err != nil {
		a.mu.Unlock()
		return
	}
	a.err, a.timeout = err, timeout
	if a.done == nil {
		a.done = make(chan struct{})
	}
	close(a.done)
	funcs := a.funcs
	a.funcs = nil
	stop := a.unfollow
	a.unfollow = nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
	for _, af := range funcs {
		go af.f()
	}
}

// timedOut reports whether the attempt timeout canceled a.
func (a *attemptCtx) timedOut() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.timeout
}

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
