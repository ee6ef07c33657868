// Package server is net/http middleware that honours the Idempotency-Key
// header, so that a request retried by a client whose response was lost is
// answered from a stored record instead of being run twice.
//
// # How it works
//
// For a protected method (POST and PATCH by default) the middleware reads the
// key, the whole body (up to a limit) and the caller's scope, fingerprints the
// request, and makes one atomic Claim on a Store:
//
//   - A new key: the handler runs under a lease that is renewed while it
//     runs. Its response is kept, stored, and only then sent, so a client
//     never receives an answer the store does not know about.
//   - The same key and request, completed: the stored status, headers and
//     body are replayed, with Idempotent-Replayed: true.
//   - The same key for a different request: 422.
//   - The same key, still in flight: 409 with Retry-After, or, with
//     WithWait, a wait for the original's response.
//   - A handler that answers 5xx, 408 or 429, or panics: the claim is
//     released, so that a retry runs again (see WithStoreStatus).
//   - A store that fails: 503 with Retry-After, and the handler does not run
//     (unless WithFailOpen).
//
// Refusals are RFC 9457 problem+json documents by default (WithErrorWriter
// changes that); each wraps an exported sentinel such as ErrKeyMismatch.
//
// # Keys, scopes and fingerprints
//
// A key is 1 to 255 bytes of printable ASCII, sent bare or as a Structured
// Field string ("..."), which name the same key. Records are addressed by
// (scope, key): by default the scope is a hash of the Authorization header
// (never the header itself), so one tenant is never served another's
// response; WithScope lets the application use its own principal. The default
// fingerprint is SHA-256 over method, path, query and body.
//
// # Replays
//
// Only allow-listed headers are stored (WithReplayHeaders); Set-Cookie,
// Authorization, Date and hop-by-hop headers never are. A response larger than
// the stored limit, or one the handler streams (Flush) or hijacks, is sent as
// it is made and recorded without its body: the request still never runs
// twice, and its replay carries the status and headers with
// Idempotent-Body-Omitted: true.
//
// # Guarantees and their limits
//
// Among concurrent requests with the same scope and key, exactly one runs the
// handler, whatever the Store, because the claim is one atomic operation.
// Completion and release are written on a context that the client's
// disconnect does not cancel. A handler whose lease is lost (its process
// stalled past the lease) has its context cancelled, and its fencing token
// (LeaseFromContext) is refused by the store from then on.
//
// With a Store whose records live outside the handler's own database, the
// handler's effects and the stored response are not one atomic write: if the
// process dies after the effect and before the response is stored, the key
// stays in flight until its lease expires, and a retry after that runs the
// handler again. pgstore's transactional mode closes that gap for handlers
// whose effects live in the same PostgreSQL database.
package server
