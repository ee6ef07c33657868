package idempotency

import (
	"context"
	"net/http"

	"github.com/idemkit/idempotency/internal/derive"
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

// ContextWithStep returns a copy of ctx that names, with step, the
// downstream operation of the requests made with it, for the key that the
// Client derives from the incoming key of the request being handled (see
// Client.DerivedKey). Without a step, the Client names the operation by the
// request's method and URL (without user information or fragment), so two
// calls to the same endpoint in one handler (two charges of one order, say)
// would share a key, and the second would get the first one's replay: give
// each its own step ("charge-deposit", "charge-balance"). The same name in
// every run of the handler gives the same key, which is the point; a name
// that changes from one run to the next (a time, a random number) defeats
// it.
func ContextWithStep(ctx context.Context, step string) context.Context {
	return derive.WithStep(ctx, step)
}

// DerivedKey returns the idempotency key that c derives from the incoming
// key that ctx carries (put there by the middleware of package server for
// the request being handled) for the downstream operation step, and true;
// or "", false when ctx carries no incoming key. It is the key that c
// sends for a request made with ContextWithStep(ctx, step) (in the form of
// the request's Dialect, if its Key rewrites keys), for code that calls
// another service through an SDK of its own, such as stripe-go's
// Params.IdempotencyKey. The zero Client derives without a secret; a
// Client with WithDerivedKeySecret, with it.
//
// The key is deterministic: the same incoming key, scope and step give the
// same key, in every process and in every version of this module, so that
// a handler retried after an upgrade sends the keys its first run sent.
// Another service, in any language, can reproduce it:
//
//  1. Take the incoming key K, as the middleware read it (the text between
//     the quotes of a key sent as a structured-field string), the scope S
//     (what the middleware's scope function returned for the caller: the
//     record's scope) and the step T (the name given to ContextWithStep;
//     or, for a request without one, its method, a space and its URL
//     without user information or fragment, as Go's url.URL.String writes
//     it, such as "POST https://api.example.com/charges?currency=eur"),
//     each as its bytes.
//  2. Compute H = HMAC-SHA256 with K as the HMAC key, over the message
//     "idempotency derived key v1", one 0x00 byte, the length of S in
//     bytes as an unsigned LEB128 varint (one byte, the length itself,
//     for a scope under 128 bytes), S, and then T.
//  3. With a secret Z (WithDerivedKeySecret), replace H by HMAC-SHA256
//     with Z as the HMAC key, over "idempotency derived key secret v1",
//     one 0x00 byte, and H (32 bytes).
//  4. The key is H's first 16 bytes as a UUID, with byte 6 set to
//     (byte 6 AND 0x0F) OR 0x80 (version 8) and byte 8 to (byte 8 AND
//     0x3F) OR 0x80 (RFC 9562's variant), written as 32 lowercase
//     hexadecimal digits in groups of 8, 4, 4, 4 and 12 joined by hyphens.
//
// For example, the incoming key "order-42" in the scope "tenant-7" gives,
// for the step "charge", 74222cf6-ee01-8d99-a7f9-b4f2ebb7aa29.
//
// Without a secret, the key reveals the incoming key only to whoever can
// guess it: a downstream service knows its own URL, and so the step of a
// request without one, and may know the scope; given a derived key, it can
// try candidate incoming keys against it, offline, as fast as it can
// compute an HMAC. That is hopeless for the keys that this package's Client
// makes (random UUIDs, 122 bits), and quick for an order number, a
// sequential or timestamped ID, or anything a person typed. When incoming
// keys can be guessed and the downstream service must not learn them, give
// the Client a secret (WithDerivedKeySecret). Either way, two tenants'
// equal keys give different derived keys, and a derived key does not
// contain the incoming key or the scope.
//
// The version 8 UUID is valid in the syntax of the IETF draft and in APIs
// that ask for a UUID.
func (c *Client) DerivedKey(ctx context.Context, step string) (string, bool) {
	s, ok := derive.Sum(ctx, step, c.config().secret)
	if !ok {
		return "", false
	}
	return derive.UUID(s, 8), true
}

// derivedKeyFor returns the key derived for req, if req's context carries an
// incoming key.
func (cfg *config) derivedKeyFor(req *http.Request, method string) (string, bool) {
	s, ok := derive.ForRequest(req.Context(), method, req.URL, cfg.secret)
	if !ok {
		return "", false
	}
	return derive.UUID(s, 8), true
}

// WithDerivedKeySecret makes the Client derive the keys of downstream calls
// (see Client.DerivedKey) with secret as well as the incoming key, so that a
// derived key reveals nothing of the incoming key to whoever lacks the
// secret, however guessable the incoming key is. It is needed when the
// incoming keys can be guessed (order numbers, sequential or timestamped
// IDs, keys typed by people) and the downstream service, or anyone who sees
// its keys, must not learn them; keys made by this package's Client, random
// UUIDs, need none.
//
// Every process that runs the handler must have the same secret, and keep
// it: a retry that takes a key over in another process, or after a
// restart, must derive the keys that the first run sent. A new secret makes
// new keys, so a handler retried across the change has its effect
// downstream run again: change it only when no record younger than the
// downstream service's retention was handled with the old one. secret must
// have at least 16 bytes (128 bits; use 32 random bytes); it is copied.
func WithDerivedKeySecret(secret []byte) Option {
	return func(c *config) {
		if len(secret) < derive.MinSecret {
			c.refuse("WithDerivedKeySecret needs at least %d bytes, got %d", derive.MinSecret, len(secret))
			return
		}
		c.secret = append([]byte(nil), secret...)
	}
}
