package idempotency

import (
	"log/slog"
	"net/http"
	"net/url"

	"github.com/idemkit/idempotency/internal/keyfield"
)

// KeyHonour says what a response tells of whether the server honours the
// idempotency key; see [Outcome.Honour].
type KeyHonour uint8

// What a response tells of the key.
const (
	// HonourUnknown: nothing tells. The request had no key, or it was
	// answered at the first attempt with neither an echo of the key nor a
	// replay marker, which is all that a server that honours keys but
	// does not echo them sends.
	HonourUnknown KeyHonour = iota
	// Honoured: the response carries the key back in the key header (as
	// package server's middleware does by default), or is marked as a
	// replay.
	Honoured
	// MayNotHonour: the request was retried, and the response carries
	// neither the key back nor a replay marker. A server that ignores keys
	// answers so; if this one does, an earlier attempt may have run the
	// operation too. The response is returned as any other; the Client
	// also logs it once at level Warn, if it has a logger.
	MayNotHonour
)

var keyHonourNames = [...]string{
	HonourUnknown: "unknown",
	Honoured:      "honoured",
	MayNotHonour:  "may_not_honour",
}

// String returns the name of h: "unknown", "honoured", "may_not_honour".
func (h KeyHonour) String() string {
	if int(h) < len(keyHonourNames) {
		return keyHonourNames[h]
	}
	return "invalid"
}

// checkHonoured records what resp, the response that Do returns, tells of
// the key.
func (c *call) checkHonoured(resp *http.Response) {
	if c.key == "" {
		return
	}
	switch {
	case echoes(resp.Header[c.cfg.header], c.key) || c.cfg.replayed(resp.Header):
		c.honour = Honoured
	case c.attempts > 1:
		c.honour = MayNotHonour
		if l := c.cfg.logger; l != nil && c.cfg.doubtLogged.CompareAndSwap(false, true) {
			u := url.URL{Scheme: c.url.Scheme, Host: c.url.Host, Path: c.url.Path}
			l.LogAttrs(c.ctx, slog.LevelWarn,
				"idempotency: the server may not honour idempotency keys: a retried request was answered without the key back or a replay marker; later ones are not logged",
				slog.String("key", c.key), slog.String("method", c.method), slog.String("url", u.String()),
				slog.Int("attempts", c.attempts), slog.Int("status", resp.StatusCode))
		}
	}
}

// echoes reports whether the values of a response's key header hold key,
// bare or as a Structured Field string.
func echoes(values []string, key string) bool {
	if len(values) != 1 {
		return false
	}
	if values[0] == key {
		return true
	}
	got, err := keyfield.Parse(values[0])
	return err == nil && got == key
}

// replayed reports whether h, a response's header, marks it as a replay.
// The name is canonical already: no need for Header.Get to make it so.
func (cfg *config) replayed(h http.Header) bool {
	vs := h[cfg.replayHeader]
	return len(vs) > 0 && vs[0] == "true"
}
