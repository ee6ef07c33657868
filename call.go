package idempotency

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// Bounds of the drain of a response body that is discarded before a retry.
const (
	drainLimit   = 4 << 10
	drainTimeout = 250 * time.Millisecond
)

// call is the state of one call to Do. The engine, go-retryablehttp, runs
// the attempts; every decision is taken here, in checkRetry, and the engine
// only carries it out.
type call struct {
	ctx context.Context // the caller's

	cfg          *config
	method       string
	url          *url.URL
	key          string
	keyValue     [1]string // the header's value, when the Client sets it
	retryable    bool      // idempotent method or keyed
	viaTransport bool

	body     replay
	nextBody io.ReadCloser // made in checkRetry, sent by prepareRetry
	hasNext  bool

	attempts int
	spent    int64 // budget tokens taken by this call's retries
	wait     time.Duration
	stopped  error
	kind     EventKind    // what followed the last attempt
	obs      *observation // for the observer, if there is one

	clone  http.Request // the request of the first attempt
	first  attemptCtx   // the context of the first attempt
	engine retryablehttp.Client
	req    retryablehttp.Request
}

type callKey struct{}

// run makes the attempts of req, whose body is prepared and whose context
// is c.first.
func (c *call) run(req *http.Request, hc *http.Client) (*http.Response, error) {
	e := &c.engine
	e.HTTPClient = hc
	e.Logger = nil // the engine logs on stderr unless told not to
	// The engine asks checkRetry after every attempt; its own count must
	// never be what stops it, or it would drop the last response.
	e.RetryMax = math.MaxInt
	// Not the method value c.checkRetry, which would cost an allocation
	// per call: the engine passes the request's context, which is c.
	e.CheckRetry = checkRetry
	// Backoff, PrepareRetry and ErrorHandler are set by checkRetry when
	// they are needed: the first attempt usually succeeds.

	// The engine's body field stays empty, so that it never touches the
	// request body; prepareRetry gives each retry its own.
	c.req.Request = req
	observe := c.obs != nil
	if observe {
		c.obs.sent = time.Now()
	}
	resp, err := e.Do(&c.req)
	if c.hasNext && c.nextBody != nil {
		c.nextBody.Close()
	}
	if err != nil {
		re, ok := err.(*RetryError)
		if !ok {
			// The context ended during the wait before a retry.
			c.kind = EventCanceled
			if observe {
				c.obs.noAttempt(err)
			}
			re = &RetryError{Key: c.key, Attempts: c.attempts, Err: err, Stopped: c.stopped}
		}
		if observe {
			c.finish()
		}
		return nil, re
	}
	if observe {
		c.finish()
	}
	return resp, nil
}

// checkRetry is the engine's CheckRetry: c.checkRetry for the call whose
// attempt has ctx, the context of the request.
func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	a, ok := ctx.(*attemptCtx)
	if !ok {
		// The engine always passes the context of the request that run
		// gave it, or that checkRetry set, which is an attemptCtx.
		return false, nil
	}
	return a.call.checkRetry(resp, err)
}

// checkRetry decides after each attempt. It never returns an error, so
// that when it says no the engine returns the attempt's response, or, if
// there is none, calls giveUp.
func (c *call) checkRetry(resp *http.Response, err error) (bool, error) {
	retry := c.decide(resp, err)
	if retry {
		if resp != nil {
			// Not left to the engine, whose drain has no time limit.
			c.discard(resp)
		}
		// The next attempt has a context of its own, which the last
		// attempt's timeout has not canceled. The engine waits on it,
		// then sends a copy of this request.
		next := new(attemptCtx)
		next.init(c.ctx, c, c.cfg.attemptTimeout, c.wait)
		c.req.Request = c.req.Request.WithContext(next)
	}
	if (retry || err != nil) && c.engine.ErrorHandler == nil {
		// The engine reads these after CheckRetry returns. Set only now,
		// they cost nothing to the many requests whose first attempt
		// succeeds.
		c.engine.Backoff = c.backoff
		c.engine.PrepareRetry = c.prepareRetry
		c.engine.ErrorHandler = c.giveUp
	}
	return retry, nil
}

// decide decides whether to make another attempt and, if so, prepares it.
func (c *call) decide(resp *http.Response, err error) bool {
	c.attempts++
	cfg := c.cfg
	if c.obs != nil {
		c.obs.record(c, resp, err)
	}
	if c.ctx.Err() != nil {
		// The caller canceled or ran out of time: no policy can overrule
		// that.
		c.kind = EventCanceled
		if err == nil && !cfg.policy(resp, err) {
			// An answer that needed no retry anyway.
			c.kind = EventCompleted
		}
		return false
	}
	if !cfg.policy(resp, err) {
		c.kind = EventFailed
		if err == nil {
			c.kind = EventCompleted
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
	if cfg.onRetry != nil {
		info := RetryInfo{Key: c.key, Attempt: c.attempts, Wait: wait, Err: err,
			Result: c.resultOf(resp, err), Budget: cfg.budget.left()}
		if resp != nil {
			info.StatusCode = resp.StatusCode
		}
		cfg.onRetry(info)
	}
	if c.obs != nil {
		c.emit(EventRetried)
	}
	c.log(slog.LevelInfo, "idempotency: retrying", resp, err, slog.Duration("wait", wait))
	return true
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
	c.nextBody, c.hasNext = body, true
	return wait, nil
}

// discard drains and closes the body of a response that is not returned,
// so that its connection can be reused, and replaces it with http.NoBody.
// It reads at most drainLimit bytes, for at most drainTimeout (or the
// attempt timeout, if shorter): a body that stalls is closed unread, which
// closes its connection, and the retry goes on.
func (c *call) discard(resp *http.Response) {
	body := resp.Body
	resp.Body = http.NoBody
	if body == nil || body == http.NoBody {
		return
	}
	bound := drainTimeout
	if t := c.cfg.attemptTimeout; t > 0 {
		bound = min(bound, t)
	}
	// net/http's response bodies may be closed while a Read is blocked,
	// which ends the Read.
	timer := time.AfterFunc(bound, func() { body.Close() })
	io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	timer.Stop()
	body.Close()
}

// backoff is the engine's Backoff: the wait that checkRetry chose.
func (c *call) backoff(_, _ time.Duration, _ int, _ *http.Response) time.Duration {
	return c.wait
}

// prepareRetry is the engine's PrepareRetry, called with a fresh shallow
// copy of the request before each retry: it gives the copy its own body.
func (c *call) prepareRetry(req *http.Request) error {
	if c.obs != nil {
		c.obs.sent = time.Now()
	}
	if c.hasNext {
		if c.nextBody != nil {
			req.Body = c.nextBody
		}
		c.nextBody, c.hasNext = nil, false
	}
	return nil
}

// giveUp is the engine's ErrorHandler, called when checkRetry said no to an
// attempt that has no usable response.
func (c *call) giveUp(resp *http.Response, err error, _ int) (*http.Response, error) {
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
	return nil, &RetryError{Key: c.key, Attempts: c.attempts, Err: err, Stopped: c.stopped}
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
