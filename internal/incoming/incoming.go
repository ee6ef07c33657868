// Package incoming carries the idempotency key of the request being handled
// from the server middleware, which puts it in the handler's context, to the
// client, which derives the keys of the handler's downstream calls from it.
// The client and the server packages import this package and never each
// other.
package incoming

import "context"

// Key is the key of the request being handled, within its scope.
type Key struct {
	Scope string
	Key   string
}

// ContextKey is the context key under which a *Key is found. It is exported
// so that a context type of the middleware's own can answer Value for it
// without an allocation.
type ContextKey struct{}

// NewContext returns a copy of ctx that carries k.
func NewContext(ctx context.Context, k *Key) context.Context {
	return context.WithValue(ctx, ContextKey{}, k)
}

// FromContext returns the key that ctx carries, if any.
func FromContext(ctx context.Context) (*Key, bool) {
	k, ok := ctx.Value(ContextKey{}).(*Key)
	return k, ok && k != nil
}
