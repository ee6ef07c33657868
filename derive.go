package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idempotency/internal/derive"
	"github.com/idemkit/idempotency/internal/keyfield"
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

// ErrDerivedKeyFormat is returned, wrapped, by Do and Client.DerivedKey
// for a request that would get a derived key from a Client whose keys are
// made by a key function (WithKeyFunc) and which has no function for
// derived keys (WithDerivedKeyFunc): a key function makes a new key each
// time, which a derived key must not be, and the key format it stands for
// is unknown to the Client. Nothing is sent.
var ErrDerivedKeyFormat = errors.New("a key function (WithKeyFunc) cannot make a derived key: give WithDerivedKeyFunc")

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
	return derive.WithStep(ctx, step)
}

// DerivedKey returns the idempotency key derived from the incoming key that
// ctx carries (put there by the middleware of package server for the
// request being handled) for the downstream operation step, and true; or
// "", false when ctx carries no incoming key. It is the key that a Client
// without derivation options sends for a request made with
// ContextWithStep(ctx, step), for code that calls another service through
// an SDK of its own, such as stripe-go's Params.IdempotencyKey.
// [Client.DerivedKey] gives the key of a Client with options: a secret
// (WithDerivedKeySecret) and a key format (WithKeyVersion7,
// WithDerivedKeyFunc).
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
//     (byte 6 AND 0x0F) OR 0x80 (version 8; 0x70 instead makes a version 7
//     shape, under WithKeyVersion7) and byte 8 to (byte 8 AND 0x3F) OR
//     0x80 (RFC 9562's variant), written as 32 lowercase hexadecimal
//     digits in groups of 8, 4, 4, 4 and 12 joined by hyphens. Under
//     WithDerivedKeyFunc, the key is what that function returns for the 32
//     bytes of H.
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
func DerivedKey(ctx context.Context, step string) (string, bool) {
	s, ok := derive.Sum(ctx, step, nil)
	if !ok {
		return "", false
	}
	return derive.UUID(s, 8), true
}

// DerivedKey returns the key that c derives, with its options, from the
// incoming key that ctx carries for the downstream operation step, and
// true; or "", false, nil when ctx carries no incoming key. It is the key
// that c sends for a request made with ContextWithStep(ctx, step): what
// the package's DerivedKey returns, with c's secret (WithDerivedKeySecret)
// and in c's key format (WithKeyVersion7, WithDerivedKeyFunc). It fails
// when c's WithDerivedKeyFunc fails or returns an invalid key
// (ErrInvalidKey), and when c has a key function but no WithDerivedKeyFunc
// (ErrDerivedKeyFormat).
func (c *Client) DerivedKey(ctx context.Context, step string) (string, bool, error) {
	cfg := c.config()
	s, ok := derive.Sum(ctx, step, cfg.secret)
	if !ok {
		return "", false, nil
	}
	key, err := cfg.derivedKey(ctx, s)
	if err != nil {
		return "", true, fmt.Errorf("idempotency: %w", err)
	}
	return key, true, nil
}

// derivedKeyFor returns the key derived for req, if req's context carries an
// incoming key.
func (cfg *config) derivedKeyFor(req *http.Request, method string) (key string, ok bool, err error) {
	s, ok := derive.ForRequest(req.Context(), method, req.URL, cfg.secret)
	if !ok {
		return "", false, nil
	}
	key, err = cfg.derivedKey(req.Context(), s)
	return key, true, err
}

// derivedKey writes s in the Client's key format.
func (cfg *config) derivedKey(ctx context.Context, s [derive.Size]byte) (string, error) {
	switch {
	case cfg.derivedFunc != nil:
		key, err := cfg.callDerivedFunc(ctx, s)
		if err != nil {
			return "", fmt.Errorf("making a derived key: %w", err)
		}
		if err := keyfield.Validate(key); err != nil {
			return "", fmt.Errorf("%w: derived key: %w", ErrInvalidKey, err)
		}
		return key, nil
	case cfg.keyFunc != nil:
		return "", ErrDerivedKeyFormat
	case cfg.keyV7:
		return derive.UUID(s, 7), nil
	}
	return derive.UUID(s, 8), nil
}

// WithDerivedKeySecret makes the Client derive the keys of downstream calls
// (see DerivedKey) with secret as well as the incoming key, so that a
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

// WithDerivedKeyFunc sets how the Client writes the keys it derives for
// downstream calls (see DerivedKey), for a downstream service that takes
// keys of a format of its own: fn is given the 32 bytes of the derivation
// (the HMAC of DerivedKey's step 2, or 3 with a secret) and returns the
// key, such as a prefix and some of the bytes in hexadecimal. fn must
// return the same key for the same bytes, in every process and release,
// and keep their entropy (16 bytes or more of it). If fn fails, Do
// returns its error before any attempt; if it returns an invalid key, an
// error wrapping ErrInvalidKey. By default a derived key is a version 8
// UUID, or has a version 7 UUID's shape under WithKeyVersion7; a Client
// with WithKeyFunc needs WithDerivedKeyFunc for requests made inside a
// handler, since a key function cannot derive a key (ErrDerivedKeyFormat).
func WithDerivedKeyFunc(fn func(sum [32]byte) (string, error)) Option {
	return func(c *config) {
		if fn == nil {
			c.refuse("WithDerivedKeyFunc needs a function")
			return
		}
		c.derivedFunc = fn
	}
}
