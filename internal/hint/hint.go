// Package hint reads what a server says about retrying a response: the
// problem document of a 409 or a 422 (is it the in-flight answer, or a
// final one?), the Stripe-Should-Retry and X-Should-Retry headers, and
// Retry-After. The client and its go-retryablehttp adapter decide from it.
package hint

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/wire"
)

// Answer is what a problem document says about the key.
type Answer uint8

// The answers a server gives about a key.
const (
	// None: no problem document that this package knows.
	None Answer = iota
	// InFlight: a request with the same key is still being processed
	// (409): retrying it is safe.
	InFlight
	// OutcomeUnknown: an earlier holder of the key was abandoned, and the
	// server will not run the request again (409): final.
	OutcomeUnknown
	// KeyMismatch: the key was used for another request (422): final.
	KeyMismatch
)

// DraftInFlightTitle is the title of the in-flight problem in the examples
// of the IETF Idempotency-Key draft, which gives all its problems one
// example type: servers that follow the draft tell them apart by title.
const DraftInFlightTitle = "A request is outstanding for this Idempotency-Key"

// MaxProblem is the most of a problem document that Read reads.
const MaxProblem = 4 << 10

// Body is the body of a response whose problem document Read has read: what
// it read, then the rest. It remembers the answer, so that Of finds it.
type Body struct {
	r      io.Reader
	c      io.Closer // nil when the whole body was read
	answer Answer
}

// Read reads the problem document of a response, whose body it replaces
// with a Body that gives the caller every byte. Only a 409 or a 422 with a
// problem+json (or json) body is read, at most MaxProblem bytes and for at
// most bound (when positive): past bound the body is closed, and its reader
// gets what was read, then the error.
func Read(resp *http.Response, bound time.Duration) Answer {
	if resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusUnprocessableEntity {
		return None
	}
	if b, ok := resp.Body.(*Body); ok {
		return b.answer
	}
	body := resp.Body
	if body == nil || body == http.NoBody || !isJSON(resp.Header.Get("Content-Type")) {
		return None
	}
	var stop func() bool
	if bound > 0 {
		// net/http's response bodies may be closed while a Read is
		// blocked, which ends the Read.
		stop = time.AfterFunc(bound, func() { body.Close() }).Stop
	}
	buf, err := io.ReadAll(io.LimitReader(body, MaxProblem+1))
	if stop != nil {
		stop()
	}
	b := &Body{}
	if err == nil && len(buf) <= MaxProblem {
		// All of it: the connection is free already.
		body.Close()
		b.r = bytes.NewReader(buf)
		b.answer = classify(resp.StatusCode, buf)
	} else {
		b.r, b.c = io.MultiReader(bytes.NewReader(buf), body), body
	}
	resp.Body = b
	return b.answer
}

// Of returns the answer that Read found in resp, without reading anything.
func Of(resp *http.Response) Answer {
	if b, ok := resp.Body.(*Body); ok {
		return b.answer
	}
	return None
}

func (b *Body) Read(p []byte) (int, error) { return b.r.Read(p) }

// Close closes the response body, if it was not read to its end.
func (b *Body) Close() error {
	if b.c != nil {
		return b.c.Close()
	}
	return nil
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/problem+json" || mt == "application/json")
}

func classify(status int, doc []byte) Answer {
	var p struct {
		Type  string `json:"type"`
		Code  string `json:"code"`
		Title string `json:"title"`
	}
	if json.Unmarshal(doc, &p) != nil {
		return None
	}
	switch status {
	case http.StatusConflict:
		switch {
		case p.Type == wire.TypeOutcomeUnknown || p.Code == wire.CodeOutcomeUnknown:
			return OutcomeUnknown
		case p.Type == wire.TypeInFlight || p.Code == wire.CodeInFlight ||
			strings.EqualFold(p.Title, DraftInFlightTitle):
			return InFlight
		}
	case http.StatusUnprocessableEntity:
		if p.Type == wire.TypeKeyMismatch || p.Code == wire.CodeKeyMismatch {
			return KeyMismatch
		}
	}
	return None
}

// ShouldRetry returns what the response headers Stripe-Should-Retry and
// X-Should-Retry say: allow is false when either says "false", true when
// one says "true" and none "false"; ok is false when neither says either.
func ShouldRetry(h http.Header) (allow, ok bool) {
	for _, name := range [...]string{"Stripe-Should-Retry", "X-Should-Retry"} {
		vs := h[name]
		if len(vs) == 0 {
			continue
		}
		switch strings.ToLower(strings.Trim(vs[0], " \t")) {
		case "false":
			return false, true
		case "true":
			allow, ok = true, true
		}
	}
	return allow, ok
}

// RetryAfter returns the wait asked for by the Retry-After header in h, in
// either form (delta-seconds or HTTP-date), clamped to [0, limit]. A date in
// the past means no wait. It reports false when there is no usable header
// or limit is not positive.
func RetryAfter(h http.Header, now time.Time, limit time.Duration) (time.Duration, bool) {
	vs := h["Retry-After"]
	if len(vs) == 0 || limit <= 0 {
		return 0, false
	}
	// Optional whitespace is spaces and tabs (RFC 9110, section 5.6.3).
	v := strings.Trim(vs[0], " \t")
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		// delta-seconds: digits only, as many as there are; past the limit
		// their value no longer matters.
		most := int64(limit / time.Second)
		var secs int64
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			if secs <= most {
				secs = secs*10 + int64(c-'0')
			}
		}
		if secs > most {
			return limit, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), limit), true
}
