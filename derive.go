package idempotency

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"net/url"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency/internal/incoming"
)

// Keys carried downstream.
//
// A handler behind the middleware of package server runs once per key; but
// when its holder dies after its effect and a retry takes the key over, it
// runs again. If its effect is a call to another service, that second run
// is deduplicated where the effect lives only if it sends the same key as
// the first. So, used with the context of such a handler's request (which
// carries the incoming key), the Client derives the key of each downstream
// call from the incoming key, its scope and the name of the step, instead
// of making a random one: every run of the handler sends the same key for
// the same step.

// derivation is the label of the derivation, so that no other use of an
// HMAC keyed by the incoming key can give the same bytes.
const derivation = "idempotency derived key v1\x00"

type stepKey struct{}

// ContextWithStep returns a copy of ctx that names, with step, the
// downstream operation of the requests made with it, for the key that the
// Client derives from the incoming key of the request being handled (see
// DerivedKey). Without a step, the Client names the operation by the
// request's method and URL (without user information or fragment), so two
// calls to the same endpoint in one handler (two charges of one order, say)
// would share a key, and the second would get the first one's replay: give
// each its own step ("charge-deposit", "charge-balance"). The same name in
// every run of the handler gives the same key, which is the point; a name
// that changes from one run to the next (a time, a random number) defeats
// it.
func ContextWithStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, stepKey{}, step)
}

// DerivedKey returns the idempotency key derived from the incoming key that
// ctx carries (put there by the middleware of package server for the
// request being handled) for the downstream operation step, and true; or
// "", false when ctx carries no incoming key. It is the key that the
// Client sends for a request made with ContextWithStep(ctx, step), for code
// that calls another service through an SDK of its own, such as
// stripe-go's Params.IdempotencyKey.
//
// The key is deterministic: the same incoming key, scope and step give the
// same key, in every process. It is an HMAC-SHA256, keyed by the incoming
// key, of the scope and the step, so it reveals neither the incoming key
// nor the scope, and two tenants' equal keys give different keys. It is
// written as a version 8 UUID (RFC 9562: 122 bits of the HMAC), which is
// valid in the syntax of the IETF draft and in APIs that ask for a UUID.
func DerivedKey(ctx context.Context, step string) (string, bool) {
	in, ok := incoming.FromContext(ctx)
	if !ok {
		return "", false
	}
	return deriveKey(in, step), true
}

// derivedKeyFor returns the key derived for a request made with ctx, to u
// with method, if ctx carries an incoming key.
func derivedKeyFor(ctx context.Context, method string, u *url.URL) (string, bool) {
	in, ok := incoming.FromContext(ctx)
	if !ok {
		return "", false
	}
	step, ok := ctx.Value(stepKey{}).(string)
	if !ok {
		target := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
		step = method + " " + target.String()
	}
	return deriveKey(in, step), true
}

func deriveKey(in *incoming.Key, step string) string {
	mac := hmac.New(sha256.New, []byte(in.Key))
	mac.Write([]byte(derivation))
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
