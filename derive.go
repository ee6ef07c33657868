package idempotency

import (
	"context"

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
	return derive.Key(ctx, step)
}
