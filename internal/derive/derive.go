// Package derive derives the idempotency keys of a handler's downstream
// calls from the handler's incoming key, for the client and its
// go-retryablehttp adapter alike. The derivation is specified, step by
// step, in the documentation of idempotency.DerivedKey, and pinned by the
// root package's golden test: it must never change, since a handler
// retried after an upgrade must send the keys its first run sent.
package derive

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/url"

	"github.com/idemkit/idempotency/internal/incoming"
)

// The labels of the derivation, so that no other use of an HMAC keyed by
// the incoming key, or by the secret, can give the same bytes. Changing
// them, or anything else here, changes every derived key.
const (
	label       = "idempotency derived key v1\x00"
	secretLabel = "idempotency derived key secret v1\x00"
)

// MinSecret is the length, in bytes, of the shortest secret accepted: 128
// bits, beyond the reach of a search.
const MinSecret = 16

// Size is the length of a derivation's sum.
const Size = sha256.Size

type stepKey struct{}

// WithStep returns a copy of ctx that names the downstream operation step.
func WithStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, stepKey{}, step)
}

// Sum returns the derivation for step from the incoming key in ctx, keyed
// by secret too when it is not empty, if ctx carries an incoming key.
func Sum(ctx context.Context, step string, secret []byte) ([Size]byte, bool) {
	in, ok := incoming.FromContext(ctx)
	if !ok {
		return [Size]byte{}, false
	}
	return sum(in, step, secret), true
}

// ForRequest returns the derivation for a request made with ctx, to u with
// method, if ctx carries an incoming key: for the step that ctx names, or
// else for Step(method, u).
func ForRequest(ctx context.Context, method string, u *url.URL, secret []byte) ([Size]byte, bool) {
	in, ok := incoming.FromContext(ctx)
	if !ok {
		return [Size]byte{}, false
	}
	step, ok := ctx.Value(stepKey{}).(string)
	if !ok {
		step = Step(method, u)
	}
	return sum(in, step, secret), true
}

// Step is the step of a request without one: its method, a space, and its
// URL without user information or fragment.
func Step(method string, u *url.URL) string {
	target := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
	return method + " " + target.String()
}

// sum is the HMAC-SHA256, keyed by the incoming key, of the label, the
// scope's length as an unsigned varint, the scope and the step; with a
// secret, the HMAC-SHA256 of that, keyed by the secret, after the secret's
// label.
func sum(in *incoming.Key, step string, secret []byte) [Size]byte {
	mac := hmac.New(sha256.New, []byte(in.Key))
	mac.Write([]byte(label))
	// The scope's length first, so that no scope and step can pass for
	// another pair.
	var n [binary.MaxVarintLen64]byte
	mac.Write(n[:binary.PutUvarint(n[:], uint64(len(in.Scope)))])
	mac.Write([]byte(in.Scope))
	mac.Write([]byte(step))
	var s [Size]byte
	mac.Sum(s[:0])
	if len(secret) > 0 {
		mac = hmac.New(sha256.New, secret)
		mac.Write([]byte(secretLabel))
		mac.Write(s[:])
		mac.Sum(s[:0])
	}
	return s
}

// UUID writes the first 16 bytes of s as a UUID of version v (7 or 8) and
// RFC 9562's variant, in its 36-character text form.
func UUID(s [Size]byte, v byte) string {
	var u [16]byte
	copy(u[:], s[:16])
	u[6] = u[6]&0x0f | v<<4
	u[8] = u[8]&0x3f | 0x80
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}
