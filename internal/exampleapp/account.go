package exampleapp

import (
	"context"
	"errors"
	"net/http"
)

// Accounts returns the demo accounts, by API key: alice-key-1 and
// alice-key-2 for acct_alice, bob-key for acct_bob. A real API looks up a
// hash of the key in its database.
func Accounts() map[string]string {
	return map[string]string{
		"alice-key-1": "acct_alice",
		"alice-key-2": "acct_alice",
		"bob-key":     "acct_bob",
	}
}

// accountKey is the request-context key of the authenticated account ID.
type accountKey struct{}

// WithAccount returns a copy of ctx that carries the authenticated account
// ID, for AccountFrom and Scope to find.
func WithAccount(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, accountKey{}, id)
}

// AccountFrom returns the account ID that WithAccount put in ctx, and false
// if there is none.
func AccountFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(accountKey{}).(string)
	return id, ok
}

// Authenticate returns the application's authentication, as net/http
// middleware: it answers 401 to an API key (the X-API-Key header) that is
// not in accounts, and passes the caller's account on in the request's
// context, where the handlers and Scope find it.
func Authenticate(accounts map[string]string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			account, ok := accounts[r.Header.Get("X-API-Key")]
			if !ok {
				WriteJSON(w, http.StatusUnauthorized, map[string]string{"error": "unknown or missing X-API-Key"})
				return
			}
			next.ServeHTTP(w, r.WithContext(WithAccount(r.Context(), account)))
		})
	}
}

// ErrNoAccount is the error of Scope for a request whose context carries no
// account: a route protected by the idempotency middleware but not
// authenticated.
var ErrNoAccount = errors.New("exampleapp: no authenticated account in the request context")

// Scope is the idempotency middleware's scope function, for
// server.WithScope: idempotency records belong to the authenticated account.
// Without one it returns ErrNoAccount, so the middleware refuses the request
// with 400 rather than put it in a scope shared by everyone.
func Scope(r *http.Request) (string, error) {
	account, ok := AccountFrom(r.Context())
	if !ok {
		return "", ErrNoAccount
	}
	return "account:" + account, nil
}
