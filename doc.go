// Package idempotency makes retried HTTP requests safe: its Client sends an
// Idempotency-Key with each POST and PATCH and retries the request with the
// same key, so that a server honouring the key (such as one using the
// middleware of package server) runs the operation at most once, however
// many attempts reach it.
//
//	client, err := idempotency.NewClient() // or the zero Client
//	if err != nil { ... }
//	resp, err := client.Post(ctx, "https://api.example.com/orders", "application/json", body)
//	if err != nil { ... } // a *RetryError: no attempt got a response
//	defer resp.Body.Close()
//	out, _ := idempotency.OutcomeOf(resp) // the key, the attempts, whether it was a replay
//
// [Client.Do] takes any *http.Request, [Client.StandardClient] gives an
// *http.Client for SDKs that take one, and [ContextWithKey] carries a key
// stored with an operation, so that a retry after a restart sends it again.
// Inside a handler behind the middleware of package server, the Client
// derives the key of each downstream call from the handler's own incoming
// key ([ContextWithStep], [Client.DerivedKey]). Package retryable makes an
// existing go-retryablehttp client safe in the same way.
//
// # The APIs it calls
//
// One Client speaks to each destination in its own Dialect: the header of
// the key, the key's form and limits, the replay marker, and how the API
// refuses a key reused with another payload or says that a request with it
// is still in progress. Package vendors has the rules of Stripe, Adyen,
// PayPal, Checkout.com, Worldline, Azure (OASIS Repeatable Requests),
// Telnyx and Resend, each from its published documentation:
//
//	client, err := idempotency.NewClient(idempotency.WithDialect(
//		func(req *http.Request) idempotency.Dialect {
//			switch req.URL.Hostname() {
//			case "api.stripe.com":
//				return vendors.Stripe()
//			case "api-m.paypal.com":
//				return vendors.PayPal()
//			case "my-acs.communication.azure.com":
//				return vendors.Azure()
//			}
//			return idempotency.Dialect{} // this module's own
//		}))
//
// Outcome then tells the truth for each: Replayed from the API's marker,
// Stopped = ErrKeyMismatch for its changed-payload refusal, and its
// in-flight answer retried after the wait it asks for. For OASIS, the
// Client sends Repeatability-First-Sent, fixed at the first attempt, and
// ContextWithKey carries it with the key across restarts.
//
// # The problem
//
// A client that sends "charge 10 euros" and sees its connection drop cannot
// know whether the server charged: the request may have been lost on the
// way, or only the response on the way back. Sending it again may charge
// twice; not sending it may not charge at all. An idempotency key resolves
// this: the client makes a unique key once per operation, before the first
// attempt, and sends it on every attempt. The server records each key with
// the response it produced, and answers a repeated key with the recorded
// response, marked Idempotent-Replayed: true, instead of running the
// operation again.
//
// # What the Client does
//
// Client.Do (and Post and StandardClient, which go through it):
//
//   - adds a key to every request of a keyed method (POST and PATCH by
//     default) that has none: the key from the request's context if
//     ContextWithKey put one there, or one derived from the incoming key
//     of the request being handled (see Keys carried downstream), or else
//     a new random UUID (NewKey), in the header and the form of the
//     request's Dialect. A key
//     already in the header, under any letter case of its name, is kept
//     and sent once, under the canonical name; a header with two keys is
//     refused (ErrInvalidKey). The same key is sent on every attempt. The
//     caller's request is never modified.
//   - retries transient failures: transport errors and attempt timeouts,
//     where the response may have been lost, and the statuses that say
//     "try again"; [DefaultPolicy] lists them, and what is never retried
//     (the caller's own cancellation or deadline, certificate errors,
//     refused redirects, 422 and the other client errors). A 409 is
//     retried only when it is the in-flight answer, not when it
//     is a business conflict. The server's final answers, "outcome
//     unknown" and "key reused for another request", are never retried
//     (ErrOutcomeUnknown, ErrKeyMismatch in Outcome.Stopped), nor is a
//     response marked as a replay, whatever its status. The retry
//     hints Stripe-Should-Retry and X-Should-Retry are followed: "false"
//     stops (ErrRetryRefused), "true" retries, within the same limits.
//   - retries only requests that are safe to repeat: those whose method is
//     idempotent by HTTP semantics (GET, HEAD, PUT, DELETE, OPTIONS,
//     TRACE) and those with a key. A POST without a key is sent once,
//     whatever happens, because repeating it is how orders get placed
//     twice.
//   - waits between attempts with exponential backoff and full jitter
//     (WithBackoff), or as long as a Retry-After header asks, in either
//     form, up to a limit (WithMaxRetryAfter). It does not start a wait
//     that would end after the context's deadline: it returns the last
//     result at once.
//   - bounds each attempt's wait for response headers (WithAttemptTimeout),
//     separately from the context, which bounds the whole call.
//   - draws retries from a retry budget shared by the Client's requests
//     (Budget), so that a failing server does not get several times its
//     usual traffic.
//   - replays the request body on retries from GetBody or from a copy kept
//     in memory, up to a limit (WithMaxBufferedBody); a larger body without
//     GetBody is sent once and not retried.
//   - returns the last response, whatever its status, as net/http does, and
//     an error (*RetryError) only when there is no response. OutcomeOf
//     tells from the response which key was sent, how many attempts were
//     made, whether the response is a replay, why retrying stopped if it
//     stopped early, and whether the server showed that it honours the key
//     (Outcome.Honoured): a retried request answered with neither the key
//     echoed back nor a replay marker is reported, and logged once, as
//     from a server that may not honour keys.
//
// It is quiet: it logs only to a logger given with WithLogger, and tells an
// observer given with WithObserver what each attempt got and what followed (an Event: retried,
// completed, replayed, gave up, failed, canceled), the material of metrics
// and traces (module github.com/idemkit/idempotency/idemotel turns them into
// OpenTelemetry's). Responses of failed attempts
// are drained (up to 4 KiB, for at most 250 ms or the attempt timeout if
// shorter) and closed, so that their connections can be reused; a body that
// stalls is closed unread, with its connection, and the retry goes on. Idle
// connections of the Transport, which may be shared, are never closed.
// A Policy or observer that panics is recovered: the first
// panic is logged, the response bodies are still drained or closed, and
// the call goes on (a Policy that panics says "do not retry").
//
// # Keys carried downstream
//
// A handler behind the middleware of package server runs once per key, but
// it runs again when its holder dies after its effect and a retry takes the
// key over. If the effect is a call to another service, only the same key
// on both runs lets that service deduplicate it. So, with the context of
// such a handler's request, which carries the incoming key, the Client
// derives the key of a downstream POST from the incoming key, its scope and
// a step name (ContextWithStep), or, without a step, the request's method
// and URL: the same in every run, distinct for distinct steps. Two calls to
// one endpoint in one handler need two step names, or they share a key. A
// key in the header or from ContextWithKey still wins. DerivedKey (and
// Client.DerivedKey, with the Client's options) gives the same key to code
// that calls a service through an SDK of its own. A derived key is an
// HMAC-SHA256 keyed by the incoming key, written as a version 8 UUID; the
// derivation is specified in Client.DerivedKey's documentation, so that a
// service in another language can reproduce it, and never changes between
// releases. It reveals the incoming key only to whoever can guess it: a
// downstream service that knows the scope and its own URL can try
// candidates, so guessable incoming keys (order numbers) need a secret,
// WithDerivedKeySecret. A derived key is sent in the form that the
// request's Dialect gives keys (Dialect.Key).
//
// # Limits
//
// The key protects against duplicates only if the server honours it, and
// only for as long as it keeps the key (commonly 24 hours). A key lives in
// memory for one call to Do: an operation that must survive a crash of the
// client needs a key stored with the operation and given to every try
// through ContextWithKey. Reusing a key for a different request is an error that a
// careful server answers with 422, which is not retried. The server may
// answer 409 while an earlier attempt with the same key is still running;
// that is retried, after the Retry-After it gives; any other 409 is not.
//
// The Client keys POST and PATCH requests and not PUT or DELETE, which are
// idempotent by definition and retried without a key; WithMethods
// changes the set.
package idempotency
