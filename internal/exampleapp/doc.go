// Package exampleapp is the orders API of the router examples
// (examples/servemux and examples/routers/chi, gin and echo), all of it but
// the router: the demo accounts and their authentication, the scope function
// of the idempotency middleware, the orders, and the program's serving and
// shutting down. Each example keeps what its router changes: the routes, the
// idempotency middleware on POST /orders, and the handlers, which read the
// router's path parameters and write its responses.
//
// # Who the key belongs to
//
// The idempotency middleware of package server keeps a record per (scope,
// key), and its scope function names the caller. These APIs authenticate
// their callers by the X-API-Key header, so the default scope, a hash of the
// Authorization header, would put every caller in one empty scope, where one
// account could be served another's order. Instead:
//
//  1. The application's authentication middleware (Authenticate, or the
//     router's own version of it) runs first, for every route. It looks the
//     API key up in the accounts, answers 401 if it is unknown, and puts the
//     account ID in the request's context with WithAccount.
//  2. The idempotency middleware, on the routes it protects, calls its scope
//     function, Scope (given with server.WithScope), which reads the account
//     ID from the request's context.
//
// So two accounts that send the same key never share a record, and the two
// API keys of one account do: a retry made with a rotated key is still a
// retry. A route wrapped by the idempotency middleware but not by the
// authentication gets 400 rather than a shared scope, because Scope fails
// when it finds no account.
package exampleapp
