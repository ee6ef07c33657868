package idempotency

import (
	"log/slog"
	"net/http"
	"net/url"

	"github.com/idemkit/idempotency/internal/keyfield"
)

// checkHonoured records what resp, the response that Do returns, tells of
// the key.
func (c *call) checkHonoured(resp *http.Response) {
	if c.key == "" {
		return
	}
	if c.acked || c.replayed || echoes(resp.Header[c.d.header], c.key, c.keyValue[0]) {
		c.honoured = true
		return
	}
	if c.attempts > 1 {
		if l := c.cfg.logger; l != nil && c.cfg.doubtLogged.CompareAndSwap(false, true) {
			u := url.URL{Scheme: c.url.Scheme, Host: c.url.Host, Path: c.url.Path}
			l.LogAttrs(c.ctx, slog.LevelWarn,
				"idempotency: the server may not honour idempotency keys: a retried request was answered without the key back or a replay marker; later ones are not logged",
				slog.String("key", c.key), slog.String("method", c.method), slog.String("url", u.String()),
				slog.Int("attempts", c.attempts), slog.Int("status", resp.StatusCode))
		}
	}
}

// echoes reports whether the values of a response's key header hold the
// key, bare, in the form it was sent in, or as a Structured Field string.
func echoes(values []string, key, wire string) bool {
	if len(values) != 1 {
		return false
	}
	if values[0] == key || wire != "" && values[0] == wire {
		return true
	}
	got, err := keyfield.Parse(values[0])
	return err == nil && got == key
}

// Replay markers that the zero Dialect reads: this module's and Stripe's
// (https://docs.stripe.com/api/idempotent_requests), and those of other
// APIs: Integrated Finance's
// (https://developer.integrated.finance/changelog/release-notes-for-idempotency-support),
// PPRO's (https://developerhub.ppro.com/global-api/reference/api-requests-idempotency)
// and fiskaly's (https://developer.fiskaly.com/blog/unified-api-idempotency-transparency).
const (
	markerReplayed      = "Idempotent-Replayed"    // true
	markerStatus        = "X-Idempotency-Status"   // replayed
	markerPPRO          = "Request-Idempotency"    // true
	markerXReplayed     = "X-Idempotency-Replayed" // true
	markerValueTrue     = "true"
	markerValueReplayed = "replayed"
)

// replayedDefault reports whether h, a response's header, has a replay
// marker that d reads without an Answer of its own: Idempotent-Replayed,
// and for a Dialect whose key header is not Idempotency-Key the markers of
// the other APIs too. The names are canonical already: no need for
// Header.Get to make them so.
func replayedDefault(d *dialect, h http.Header) bool {
	if isMarker(h[markerReplayed], markerValueTrue) {
		return true
	}
	return d.others && (isMarker(h[markerStatus], markerValueReplayed) ||
		isMarker(h[markerPPRO], markerValueTrue) ||
		isMarker(h[markerXReplayed], markerValueTrue))
}

func isMarker(vs []string, want string) bool {
	if len(vs) == 0 {
		return false
	}
	v := vs[0]
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		// fiskaly quotes its value.
		v = v[1 : len(v)-1]
	}
	return v == want || len(v) == len(want) && asciiEqualFold(v, want)
}

func asciiEqualFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
