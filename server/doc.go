// Package server is net/http middleware that honours the Idempotency-Key
// header, so that a request retried by a client whose response was lost is
// answered from a stored record instead of being run twice.
//
//	store, err := memstore.New() // one process; pgstore or redisstore for several
//	if err != nil { ... }
//	mw, err := server.New(store, server.WithScope(accountOf))
//	if err != nil { ... }
//	mux.Handle("POST /orders", mw.Handler(createOrder))
//
// [New] takes a [Store] and options; [Middleware.Handler] wraps a handler
// (its shape is the one routers take for middleware); [LeaseFromContext]
// gives the handler its key and fencing token. [WithScope] should name the
// caller the application has authenticated: records are kept per scope.
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
//   - A handler that returns without answering because its context ended
//     (the client went away): the claim is released, nothing is stored.
//   - A store that fails or is slower than the store timeout: 503 with
//     Retry-After, and the handler does not run (unless WithFailOpen).
//   - A request body that cannot be read: 413 when it is too large (for the
//     middleware's limit or an http.MaxBytesReader in front of it), 400
//     otherwise; nothing is claimed.
//
// Every answer to a request with a valid key, the original, a replay or a
// refusal, carries the key back in the Idempotency-Key header (WithEchoKey).
//
// WithObserver receives an Event for every protected request (executed,
// replayed, in flight, mismatch, rejected, unavailable, released, not
// stored, unprotected, client gone) with the time the claim, the handler and
// the store write took, one when a claim acquires its key, and one for
// every lease renewal or loss: what metrics and traces are made of (the
// module github.com/idemkit/idempotency/idemotel turns them into
// OpenTelemetry metrics and spans).
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
// fingerprint is SHA-256 over method, escaped path, query and body.
//
// # Replays
//
// Only allow-listed headers are stored (WithStoredHeaders); Set-Cookie,
// Authorization, Date and hop-by-hop headers never are. The default list
// holds the headers that describe the stored body (Content-Type,
// Content-Encoding, Content-Language, ETag, ...), so that a replay is the same
// representation, byte for byte. Each replay's headers are a copy of the
// record's: nothing a writer in front of the middleware does to them reaches
// the record. A response larger than
// the stored limit, or one the handler streams (Flush) or hijacks, is sent as
// it is made and recorded without its body: the request still never runs
// twice, and its replay carries the status and headers with
// Idempotent-Body-Omitted: true.
//
// # Guarantees and their limits
//
// Among concurrent requests with the same scope and key, exactly one runs the
// handler, whatever the Store, because the claim is one atomic operation.
//
// Every Store call runs on a context that the client's disconnect does not
// cancel (a dropped connection is exactly when the retry will come), bounded
// by the store timeout (WithStoreTimeout, 5 seconds): a Claim that fails,
// hangs or is slower than that is answered with 503 and Retry-After, and the
// handler does not run. The bound relies on the Store returning when its
// context's deadline passes, as the stores of this module do.
//
// The lease is renewed every third of its length until the response is stored
// or the claim released. The middleware knows when the lease ends: its length
// after the Claim or Extend that last granted it was sent. If that moment,
// less a tenth of the lease, passes without a successful renewal (the store
// failed, was too slow, or said the lease was lost), the handler's context is
// cancelled with a cause that wraps ErrLeaseLost (ErrLeaseExpired when the
// renewals failed), before another request can take the key over. A holder
// whose lease was lost cannot complete or release the record: its fencing
// token (LeaseFromContext) is refused by the store, and can be checked by
// downstream systems too. A handler that ignores its context can still run
// past its lease.
//
// When Complete fails after the handler ran, it is retried within the store
// timeout while the lease is kept alive. If it still fails, the handler's
// response is sent anyway (the effect happened, and the client is told what it
// was), the key is kept claimed rather than released, and an error is logged
// with the key and scope. The middleware then goes on trying to store the
// response, on the request's goroutine, for up to one lease length while the
// lease holds: a retry gets 409 meanwhile, and the replay once the store
// answers; if it never does, a retry after the lease has ended runs the
// request again. Over HTTP/1.1 the client has the whole response at once (it
// is sent with its length and flushed); over HTTP/2 the stream ends only when
// the middleware returns, so a client that reads the body to its end waits for
// the store, at most the lease. A failing Release is retried within the store timeout; a
// key that could not be released answers 409 until its lease ends.
//
// A Claim whose answer is lost (the store applied it, then failed or
// timed out) is answered 503 and runs nothing, but the key stays in flight
// with no holder: retries get 409 until its lease ends.
//
// A 409 for a request in flight carries a short Retry-After, one second by
// default (WithRetryAfter), never more than the lease has left.
//
// With a Store whose records live outside the handler's own database, the
// handler's effects and the stored response are not one atomic write: if the
// process dies after the effect and before the response is stored, the key
// stays in flight until its lease expires, and a retry after that runs the
// handler again. pgstore's transactional mode closes that gap for handlers
// whose effects live in the same PostgreSQL database.
package server
