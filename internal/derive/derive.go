// Package derive derives the idempotency keys of a handler's downstream
// calls from the handler's incoming key, for the client and its
// go-retryablehttp adapter alike; see idempotency.DerivedKey.
package derive

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"net/url"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/internal/incoming"
)

// label is the label of the derivation, so that no other use of an HMAC
// keyed by the incoming key can give the same bytes. Changing it, or
// anything else here, changes every derived key: a handler retried after an
// upgrade would send new keys.
const label = "idempotency derived key v1\x00"

type stepKey struct{}

// WithStep returns a copy of ctx that names the downstream operation step.
func WithStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, stepKey{}, step)
}

// Key returns the key derived for step from the incoming key in ctx, if
// ctx carries one.
func Key(ctx context.Context, step string) (string, bool) {
	in, ok := incoming.FromContext(ctx)
	if !ok {
		return "", false
	}
	return derive(in, step), true
}

// ForRequest returns the key derived for a request made with ctx, to u with
// method, if ctx carries an incoming key: for the step that ctx names, or
// else for the method and the URL (without user information or fragment).
func ForRequest(ctx context.Context, method string, u *url.URL) (string, bool) {
	in, ok := incoming.FromContext(ctx)
	if !ok {
		return "", false
	}
	step, ok := ctx.Value(stepKey{}).(string)
	if !ok {
		target := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
		step = method + " " + target.String()
	}
	return derive(in, step), true
}

// derive returns the HMAC-SHA256, keyed by the incoming key, of the scope
// and step, as a version 8 UUID (RFC 9562), with 122 of its bits.
func derive(in *incoming.Key, step string) string {
	mac := hmac.New(sha256.New, []byte(in.Key))
	mac.Write([]byte(label))
	// The scope's length first, so that no scope and step can pass for
	// another pair.
	var n [binary.MaxVarintLen64]byte
	mac.Write(n[:binary.PutUvarint(n[:], uint64(len(in.Scope)))])
	mac.Write([]byte(in.Scope))
	mac.Write([]byte(step))
	var u uuid.UUID
	copy(u[:], mac.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // variant 10, RFC 9562's
	return u.String()
}
