// Package server is net/http middleware that honours the Idempotency-Key
// header, so that a request retried by a client whose response was lost is
// answered from a stored record instead of being run twice.
//
//	store, err := memstore.New() // one process; pgstore or redisstore for several
//	if err != nil { ... }
//	mw, err := server.New(store, server.WithScope(accountOf))
//	if err != nil { ... }
//	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))
//
// [New] takes a [engine.Store] and options; [Middleware.Handler] wraps a handler
// (its shape is the one routers take for middleware); [engine.LeaseFromContext]
// gives the handler its key and fencing token. [WithScope] should name the
// caller the application has authenticated: records are kept per scope.
//
// The middleware is the HTTP door of package engine, which runs the
// protocol for every door (the function door in package once, the gRPC
// interceptors in module idemgrpc): the Store interface, its records, the
// lease and the events are engine's, named here as engine.Store,
// engine.Lease, engine.Event, so that one store serves every door.
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
//     engine.Config.Wait ([WithConfig]), a wait for the original's
//     response.
//   - A handler that answers 5xx, 408 or 429, or panics: the claim is
//     released, so that a retry runs again ([WithKeep] changes
//     which statuses are kept).
//   - A handler that returns without answering because its context ended
//     (the client went away): the claim is released, nothing is stored.
//   - A store that fails or is slower than the store timeout: 503 with
//     Retry-After, and the handler does not run (unless engine.Config.FailOpen).
//   - A request body that cannot be read: 413 when it is too large (for the
//     middleware's limit or an http.MaxBytesReader in front of it), 400
//     otherwise; nothing is claimed.
//
// Every answer to a request with a valid key, the original, a replay or a
// refusal, carries the key back in the Idempotency-Key header ([WithEchoKey]).
//
// Store failures, lost leases and responses that could not be stored are
// logged through [slog.Default] unless engine.Config.Logger says otherwise, each
// message at most once a second, so that an outage does not flood the log.
//
// An engine.Config.Observer receives an [engine.Event] for every protected request (executed,
// replayed, in flight, mismatch, rejected, unavailable, outcome unknown,
// released, not stored, unprotected, client gone) with the time the claim, the handler and
// the store write took, one when a claim acquires its key, and one for
// every lease renewal or loss: what metrics and traces are made of (the
// module github.com/idemkit/idempotency/idemotel turns them into
// OpenTelemetry metrics and spans). An observer that panics is recovered and
// logged once: it changes no answer and leaves no key claimed.
//
// # Problems
//
// Refusals are RFC 9457 problem+json documents by default ([WithErrorWriter]
// changes that). Each has a type URI that names its sentinel error (ErrInFlight
// is https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrInFlight) and
// a stable "code" member, also in [Error.Code], for clients to match:
//
//	code                  status  sentinel             when
//	key_missing           400     ErrMissingKey        a protected request without a key, keys required
//	key_invalid           400     ErrInvalidKey        a malformed key, the header twice, or a key WithKeyFormat refuses
//	key_too_long          400     ErrInvalidKey        a key over 255 bytes
//	request_unidentified  400     ErrUnidentified      the scope or fingerprint function failed
//	body_unreadable       400     ErrBodyUnreadable    the body could not be read to its end
//	body_too_large        413     ErrBodyTooLarge      the body is over the limit
//	key_mismatch          422     ErrKeyMismatch       the key was used for a different request
//	in_flight             409     ErrInFlight          the key's request is still running (Retry-After)
//	store_unavailable     503     ErrStoreUnavailable  the store failed or was too slow (Retry-After)
//	outcome_unknown       409     ErrOutcomeUnknown    a retry after an abandoned holder, under RefuseAbandoned (final)
//
// For example:
//
//	HTTP/1.1 409 Conflict
//	Content-Type: application/problem+json
//	Retry-After: 1
//
//	{"type":"https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrInFlight",
//	 "title":"Request in flight","status":409,"code":"in_flight",
//	 "detail":"A request with this idempotency key is still being processed; retry later."}
//
// # Keys, scopes and fingerprints
//
// A key is 1 to 255 bytes of printable ASCII, sent bare or as a Structured
// Field string ("..."), which name the same key; [WithKeyFormat] lets an API
// enforce the narrower format it publishes. Records are addressed by
// (scope, key): by default the scope is a hash of the credential headers,
// Authorization, Proxy-Authorization and the common API-key headers
// ([CredentialScope]; never the headers themselves), so one tenant is never
// served another's response. A request without any of them falls in a scope
// shared by every such caller, which is logged once: an application whose
// callers authenticate another way (a session cookie), or that knows its
// principal, names it with [WithScope]. The default fingerprint
// ([Fingerprint]) is SHA-256 over method, escaped path, query and body.
//
// The engine's settings (TTL, lease, store timeout, wait, Retry-After,
// abandoned policy, fail-open, logger, observer) are one option,
// [WithConfig], as in every door: a zero field is the engine's default, the
// largest values work (a TTL or lease over 100 years is taken as 100
// years), and a TTL shorter than the default lease shortens it.
//
// # Replays
//
// Only allow-listed headers are stored ([WithStoredHeaders], by default those
// of [DefaultStoredHeaders]); Set-Cookie,
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
// by the store timeout (engine.Config.StoreTimeout, 5 seconds): a Claim that fails,
// hangs or is slower than that is answered with 503 and Retry-After, and the
// handler does not run. The bound relies on the Store returning when its
// context's deadline passes, as the stores of this module do.
//
// The lease is renewed every third of its length until the response is stored
// or the claim released. The middleware knows when the lease ends: its length
// after the Claim or Extend that last granted it was sent. If that moment,
// less a tenth of the lease, passes without a successful renewal (the store
// failed, was too slow, or said the lease was lost), the handler's context is
// cancelled with a cause that wraps [engine.ErrLeaseLost] ([engine.ErrLeaseExpired] when the
// renewals failed), before another request can take the key over. A holder
// whose lease was lost cannot complete or release the record: its fencing
// token ([engine.LeaseFromContext]) is refused by the store, and can be checked by
// downstream systems too. A handler that ignores its context can still run
// past its lease.
//
// When Complete fails after the handler ran, it is retried within the store
// timeout while the lease is kept alive. If it still fails, the handler's
// response is sent anyway (the effect happened, and the client is told what it
// was), the key is kept claimed rather than released, and an error is logged
// with the key and scope. The middleware then goes on trying to store the
// response, on a goroutine of its own ([Middleware.Shutdown] waits for it),
// for up to one lease length while the lease holds: a retry gets 409
// meanwhile, and the replay once the store answers; if it never does, a retry
// after the lease has ended runs the request again. A failing Release (after
// a 5xx, a panic, a client gone) is retried within the store timeout, then in
// the same way as a late Complete, the lease kept meanwhile: a retry gets 409
// until the store takes the release, and then runs, told of no abandoned
// holder. If the store does not take it before the lease has ended, a retry
// after that takes the key over as from an abandoned holder (under
// [engine.RefuseAbandoned], "outcome unknown").
//
// A record in flight lives for its lease and the TTL after it (engine.Config.TTL),
// so a retry that takes over the key of a holder that was lost (its process
// died) is told of it, whatever the TTL and the lease: under
// [engine.RerunAbandoned] in [engine.Lease.Abandoned], under [engine.RefuseAbandoned] by the
// "outcome unknown" answer. A holder that takes the key over and then gives
// it back (a 5xx, a Claim answered too late) does not make the key forget
// the lost holders: the next run is told of them too.
//
// Put http.TimeoutHandler around the middleware, not inside it. Outside, its
// 503 reaches the client while the key stays held until the handler's
// response is stored. Inside, its 503 is the handler's answer: the key is
// released while the handler's goroutine still runs, and a retry runs the
// handler a second time, at the same time.
//
// A Claim whose answer is lost (the store applied it, then failed or
// timed out) is answered 503 and runs nothing, but the key stays in flight
// with no holder: retries get 409 until its lease ends, and the retry after
// that is told of an abandoned holder that never ran.
//
// A 409 for a request in flight carries a short Retry-After, one second by
// default (engine.Config.RetryAfter), never more than the lease has left.
//
// With a Store whose records live outside the handler's own database, the
// handler's effects and the stored response are not one atomic write: if the
// process dies after the effect and before the response is stored, the key
// stays in flight until its lease expires, and a retry after that runs the
// handler again. pgstore's transactional mode closes that gap for handlers
// whose effects live in the same PostgreSQL database.
package server
