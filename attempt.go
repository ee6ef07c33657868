package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
}

var _ http.RoundTripper = (*attemptTransport)(nil)

func (t *attemptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := checkURL(req.URL); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	if t.timeout <= 0 {
		return t.base.RoundTrip(req)
	}
	if deadline, ok := req.Context().Deadline(); ok && time.Until(deadline) <= t.timeout {
		// The caller's deadline comes first, and wins anyway.
		return t.base.RoundTrip(req)
	}

	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(t.timeout, func() { cancel(t.cause) })
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if context.Cause(ctx) == t.cause {
			err = t.cause
		}
		cancel(nil)
		return nil, err
	}
	if !timer.Stop() {
		// The headers came as the timer fired: the context is, or is about
		// to be, canceled, so the body cannot be read.
		resp.Body.Close()
		cancel(nil)
		return nil, t.cause
	}
	if resp.Body == http.NoBody {
		cancel(nil)
		return resp, nil
	}
	// The context must live until the body is read or closed.
	if w, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = &attemptRWBody{attemptBody{rc: w, cancel: cancel}, w}
	} else {
		resp.Body = &attemptBody{rc: resp.Body, cancel: cancel}
	}
	return resp, nil
}

// attemptBody releases an attempt's context when its response body has been
// read to the end or closed.
type attemptBody struct {
	rc     io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *attemptBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		// net/http has already returned the connection to the pool.
		b.cancel(nil)
	}
	return n, err
}

func (b *attemptBody) Close() error {
	err := b.rc.Close()
	b.cancel(nil)
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
