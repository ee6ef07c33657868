package idempotency

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/idemkit/idempotency/internal/hint"
)

// Bounds of the drain of a response body that is discarded before a retry.
const (
	drainLimit   = 4 << 10
	drainTimeout = 250 * time.Millisecond
)

// call is the state of one call to Do: run makes its attempts, and every
// decision between two of them is taken in decide.
type call struct {
	ctx context.Context // the caller's

	cfg          *config
	d            *dialect
	method       string
	url          *url.URL
	key          string
	keyValue     [1]string // the header's value, when the Client sets it
	retryable    bool      // idempotent method or keyed
	viaTransport bool

	// What the last response says of the key.
	final    answerKind // the server's final answer, if it is one
	replayed bool
	acked    bool // an answer about the key
	inFlight bool // the dialect's in-flight answer: retried
	honoured bool // of the returned response

	body     replay
	nextBody io.ReadCloser // the next attempt's, made by prepare

	attempts int
	spent    int64 // budget tokens taken by this call's retries
	wait     time.Duration
	stopped  error
	kind     EventKind    // what followed the last attempt
	obs      *observation // for the observer, if there is one

	inFlightWait time.Duration // the dialect's wait after its in-flight answer

	clone http.Request // the request of the first attempt
	first attemptCtx   // the context of the first attempt
}

type callKey struct{}

// run makes the attempts of req, whose body is prepared and whose context
// is c.first, one after the other: send, decide, drain, wait, send again.
func (c *call) run(req *http.Request, hc *http.Client) (*http.Response, error) {
	if err := c.ctx.Err(); err != nil {
		// Nothing is sent for a caller already gone: net/http may still
		// send a request whose context has ended when a connection is idle,
		// and the effect would happen for a caller that cannot learn it.
		if req.Body != nil {
			req.Body.Close()
		}
		return c.canceled(err)
	}
	for {
		if c.obs != nil {
			c.obs.sent = time.Now()
		}
		resp, err := hc.Do(req)
		if !c.decide(resp, err) {
			return c.end(resp, err)
		}
		if resp != nil {
			// Drained, so that its connection is reused; bounded, so that a
			// body that stalls does not hold up the retry.
			c.discard(resp)
		}
		if err := c.sleep(); err != nil {
			if c.nextBody != nil {
				c.nextBody.Close()
			}
			return c.canceled(err)
		}
		req = c.nextRequest(req)
	}
}

// end returns the last attempt's result: its response, or, when it has
// none, a *RetryError.
func (c *call) end(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		c.checkHonoured(resp)
		if c.obs != nil {
			c.finish()
		}
		return resp, nil
	}
	if resp != nil && resp.Body != nil {
		// Only a refused redirect comes with a response, already closed.
		resp.Body.Close()
	}
	if c.viaTransport {
		// The http.Client calling the RoundTripper adds its own.
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
	}
	if c.obs != nil {
		c.finish()
	}
	return nil, &RetryError{Key: c.key, Attempts: c.attempts, Err: err, Stopped: c.stopped}
}

// canceled ends a call whose context ended, with err, while it waited to
// retry.
func (c *call) canceled(err error) (*http.Response, error) {
	c.kind = EventCanceled
	if c.obs != nil {
		c.obs.noAttempt(err)
		c.finish()
	}
	return nil, &RetryError{Key: c.key, Attempts: c.attempts, Err: err, Stopped: c.stopped}
}

// sleep waits c.wait, or until the caller's context ends: then it returns
// the context's error.
func (c *call) sleep() error {
	if c.wait <= 0 {
		return c.ctx.Err()
	}
	t := time.NewTimer(c.wait)
	defer t.Stop()
	select {
	case <-c.ctx.Done():
		return c.ctx.Err()
	case <-t.C:
		return nil
	}
}

// nextRequest returns the request of the next attempt: a copy of prev, so
// that a Transport still writing prev (net/http may, after RoundTrip
// returns) never sees it change, with a context of its own, which the last
// attempt's timeout has not canceled, and the body that prepare made.
func (c *call) nextRequest(prev *http.Request) *http.Request {
	next := new(attemptCtx)
	next.init(c.ctx, c, c.cfg.attemptTimeout, 0)
	req := prev.WithContext(next)
	if c.nextBody != nil {
		req.Body = c.nextBody
		c.nextBody = nil
	}
	return req
}

// decide decides after each attempt whether to make another and, if so,
// prepares it: its body, its wait, its share of the budget.
func (c *call) decide(resp *http.Response, err error) bool {
	c.attempts++
	cfg := c.cfg
	if c.obs != nil {
		// Before the problem document is read: Took ends at the headers.
		c.obs.record(c, resp, err)
	}
	c.readAnswer(resp, err)
	if c.obs != nil {
		c.obs.replayed = c.replayed
	}
	transient, refused := c.transient(resp, err)
	if c.ctx.Err() != nil {
		// The caller canceled or ran out of time: no policy can overrule
		// that.
		c.kind = EventCanceled
		if err == nil && !transient && refused == nil {
			// An answer that needed no retry anyway.
			c.kind = EventCompleted
			c.stopped = finalAnswer(c.final)
		}
		return false
	}
	if refused != nil {
		c.kind = EventGaveUp
		c.stopped = refused
		c.log(slog.LevelWarn, "idempotency: not retrying", resp, err, slog.String("reason", refused.Error()))
		return false
	}
	if !transient {
		c.kind = EventFailed
		if err == nil {
			c.kind = EventCompleted
			c.stopped = finalAnswer(c.final)
			cfg.budget.succeeded(c.attempts, c.spent)
		}
		return false
	}
	wait, stop := c.prepare(resp, err)
	if stop != nil {
		c.kind = EventGaveUp
		c.stopped = stop
		c.log(slog.LevelWarn, "idempotency: not retrying", resp, err, slog.String("reason", stop.Error()))
		return false
	}
	c.kind = EventRetried
	c.wait = wait
	if c.obs != nil {
		c.emit(EventRetried)
	}
	c.log(slog.LevelInfo, "idempotency: retrying", resp, err, slog.Duration("wait", wait))
	return true
}

// readAnswer reads what the response of an attempt says of its key, as
// the call's dialect does.
func (c *call) readAnswer(resp *http.Response, err error) {
	c.final, c.replayed, c.acked, c.inFlight, c.inFlightWait = hint.None, false, false, false, 0
	if err != nil || resp == nil {
		return
	}
	if c.d.answer != nil {
		c.readVendor(resp)
		return
	}
	c.final = readAnswer(resp, c.drainBound())
	if finalAnswer(c.final) == nil {
		c.final = hint.None
	}
	c.replayed = replayedDefault(c.d, resp.Header)
	c.acked = c.final != hint.None
}

// transient reports whether the result of an attempt is one that another
// attempt may change: never a final answer of the server, nor a replay,
// which another attempt with the key would get again; always the
// dialect's in-flight answer; else what the server's retry hint says, if it
// gives one; else what the policy says. When the hint alone stops a result
// that the policy would retry, refused says so.
func (c *call) transient(resp *http.Response, err error) (transient bool, refused error) {
	if c.final != hint.None || c.replayed {
		return false, nil
	}
	if c.inFlight {
		return true, nil
	}
	// Only an error status: no hint makes a success retried.
	if err == nil && resp != nil && resp.StatusCode >= 400 {
		if allow, ok := shouldRetryHint(resp.Header); ok {
			if !allow && c.callPolicy(resp, err) {
				return false, ErrRetryRefused
			}
			return allow, nil
		}
	}
	return c.callPolicy(resp, err), nil
}

// prepare checks that another attempt is allowed and possible, and prepares
// its body and its wait. It returns why not otherwise.
func (c *call) prepare(resp *http.Response, err error) (time.Duration, error) {
	cfg := c.cfg
	switch {
	case !c.retryable:
		return 0, ErrNotIdempotent
	case !c.body.replayable():
		return 0, ErrBodyNotReplayable
	case c.attempts >= cfg.maxAttempts:
		return 0, ErrAttemptsExhausted
	}

	wait, ok := time.Duration(0), false
	if resp != nil {
		wait, ok = retryAfter(resp.Header, time.Now(), cfg.maxRetryAfter)
	}
	if !ok && c.inFlightWait > 0 && cfg.maxRetryAfter > 0 {
		// The API's own wait for an answer in flight, within the limit on
		// what a server can ask for.
		wait, ok = min(c.inFlightWait, cfg.maxRetryAfter), true
	}
	if !ok {
		wait = backoff(c.attempts-1, cfg.baseDelay, cfg.maxDelay, cfg.rand)
	}
	if deadline, ok := c.ctx.Deadline(); ok && time.Now().Add(wait).After(deadline) {
		return 0, ErrDeadline
	}

	body, berr := c.body.next()
	if berr != nil {
		return 0, berr
	}
	cost := int64(retryCost)
	if isTimeout(err) {
		cost = timeoutRetryCost
	}
	if !cfg.budget.take(cost) {
		if body != nil {
			body.Close()
		}
		return 0, ErrBudgetExhausted
	}
	c.spent += cost
	c.nextBody = body
	return wait, nil
}

// drainBound is how long a response body that is discarded, or whose
// problem document is read, may take: drainTimeout, or the attempt timeout
// if shorter.
func (c *call) drainBound() time.Duration {
	bound := drainTimeout
	if t := c.cfg.attemptTimeout; t > 0 {
		bound = min(bound, t)
	}
	return bound
}

// discard drains and closes the body of a response that is not returned,
// so that its connection can be reused, and replaces it with http.NoBody.
// It reads at most drainLimit bytes, for at most drainBound: a body that
// stalls is closed unread, which closes its connection, and the retry goes
// on.
func (c *call) discard(resp *http.Response) {
	body := resp.Body
	resp.Body = http.NoBody
	if body == nil || body == http.NoBody {
		return
	}
	// net/http's response bodies may be closed while a Read is blocked,
	// which ends the Read.
	timer := time.AfterFunc(c.drainBound(), func() { body.Close() })
	io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	timer.Stop()
	body.Close()
}

func (c *call) log(level slog.Level, msg string, resp *http.Response, err error, extra slog.Attr) {
	l := c.cfg.logger
	if l == nil || !l.Enabled(c.ctx, level) {
		return
	}
	u := url.URL{Scheme: c.url.Scheme, Host: c.url.Host, Path: c.url.Path}
	attrs := make([]slog.Attr, 0, 7)
	if c.key != "" {
		attrs = append(attrs, slog.String("key", c.key))
	}
	attrs = append(attrs,
		slog.String("method", c.method),
		slog.String("url", u.String()),
		slog.Int("attempt", c.attempts),
	)
	if resp != nil {
		attrs = append(attrs, slog.Int("status", resp.StatusCode))
	}
	if err != nil {
		// Not the *url.Error's own text, which has the query.
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	attrs = append(attrs, extra)
	l.LogAttrs(c.ctx, level, msg, attrs...)
}
