package idempotency

import (
	"context"

	"github.com/google/uuid"
)

// Header names of the protocol. Both can be changed per Client (WithHeader,
// WithReplayedHeader) for servers that use other names.
const (
	// HeaderKey is the request header that carries the idempotency key.
	HeaderKey = "Idempotency-Key"

	// HeaderReplayed is the response header with which a server says that it
	// did not run the request again but replayed the stored response of an
	// earlier attempt with the same key. Its value is "true".
	HeaderReplayed = "Idempotent-Replayed"
)

// NewKey returns a new idempotency key: a random (version 4) UUID in its
// 36-character text form, such as "f47ac10b-58cc-4372-a567-0e02b2c3d479".
// Its 122 random bits come from crypto/rand.
//
// Do calls it for every keyed request that has no key yet, so most callers
// never need it; use it to make a key that must outlive the process, store
// it with the operation, and pass it to every try of that operation with
// WithKey.
func NewKey() string {
	return uuid.NewString()
}

// newKeyV4 is the default key function.
func newKeyV4() (string, error) {
	u, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// newKeyV7 makes a time-ordered (version 7) UUID key; see WithKeyVersion7.
func newKeyV7() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

type contextKey struct{}

// WithKey returns a copy of ctx that carries key as the idempotency key for
// a request made with it. Use it when one logical operation spans several
// calls to Do, possibly in several processes: make the key once (NewKey),
// store it with the operation, and send it on every try, so that the server
// runs the operation at most once.
//
// A key in the request header takes precedence over the context's key. The
// context's key is used only for methods that get keys (POST and PATCH by
// default; see WithKeyedMethods). Do checks the key and returns an error
// wrapping ErrInvalidKey if it is not valid.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, contextKey{}, key)
}

// KeyFromContext returns the key stored in ctx by WithKey, if any.
func KeyFromContext(ctx context.Context) (string, bool) {
	key, ok := ctx.Value(contextKey{}).(string)
	return key, ok
}
