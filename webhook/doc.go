// Package webhook receives webhooks once: a door of the idempotency engine
// that verifies each delivery on its raw body before anything touches the
// store, keys it by the sender's delivery id, and answers senders the way
// they need.
//
//	rc, err := webhook.New(store, webhook.Stripe(os.Getenv("STRIPE_WEBHOOK_SECRET")))
//	...
//	http.Handle("POST /hooks/stripe", rc.Handler(http.HandlerFunc(onEvent)))
//
// Every sender delivers at least once and retries for hours or days; the
// handler behind a Receiver runs once per delivery id for as long as the
// sender may retry it.
//
// # Senders
//
// A preset says how a sender signs, where its delivery id is, how long it
// retries and how long it waits for an answer; each preset's documentation
// gives the sender's own source for each:
//
//	preset              id                        verified by                         TTL    wait
//	StandardWebhooks    webhook-id (svix-id)      HMAC "v1,<b64>" list, 5 min window  4 d    12 s
//	Stripe              the event's "id" (body)   Stripe-Signature t=,v1=, 300 s      4 d     8 s
//	GitHub              X-GitHub-Delivery         X-Hub-Signature-256 sha256=<hex>    4 d     8 s
//	Shopify             X-Shopify-Event-Id        X-Shopify-Hmac-Sha256 <b64>         24 h    4 s
//	GitLab              Idempotency-Key           X-Gitlab-Token, constant time       4 d     8 s
//
// Give a preset several secrets while one is rotated. Declare any other
// sender with a [Sender] of your own: its Verify (the signature over the raw
// body, a timestamp tolerance) and its ID (where the delivery id is).
//
// # What a delivery gets
//
//   - Verification first: a delivery that is malformed (400) or not signed
//     by a secret, or signed too long ago (401), is refused before anything
//     is claimed: a flood of forged requests writes no record.
//   - The key is the delivery id, in the scope "webhook/<sender>/<endpoint>"
//     (WithEndpoint): senders carry no per-tenant credentials, so the
//     endpoint, not a credential, separates two subscriptions.
//   - The first delivery runs the handler under a lease; a 2xx (WithKeep) is
//     stored, without its body, and answered. Any other status, a panic, or a
//     handler that gave up when its context ended releases the key, and the
//     sender's retry runs the handler again.
//   - A duplicate of a delivery that is done gets its 2xx at once, with
//     Idempotent-Replayed: true.
//   - A duplicate that arrives while the original runs waits for it, up to
//     the sender's wait (below the sender's deadline), and gets its answer.
//     Should the original still run after that, the duplicate gets 503 with
//     Retry-After, and the sender retries it later; never a 409, which a
//     sender counts as a failed delivery (Shopify removes a subscription
//     after 8 in a row).
//   - A store that fails: 503 with Retry-After, the handler not run.
//
// # Settings
//
// The engine's settings come in one WithConfig(engine.Config). Its zero
// value is right for the sender: a TTL of 0 is the sender's TTL, and a Wait
// of 0 is the sender's wait; a negative Wait disables waiting (an in-flight
// duplicate is answered 503 at once).
//
// # Steps and downstream calls
//
// The handler runs with engine.LeaseFromContext: an idempotency.Client
// used in it derives its downstream keys from the delivery id, and a step
// (package step) runs once even when the handler fails after it and the
// sender retries: the retry resumes after it (see the example).
//
// # Checking a receiver
//
// A receiver is right when a delivery sent twice at once, and once more
// after its answer, takes effect once and gets three 2xx answers, the later
// ones with Idempotent-Replayed: true; and when a delivery signed with
// another secret, or with its body changed, gets a 401 and leaves no record.
// Against the real sender: resend an event that was answered (Stripe's
// Dashboard or "stripe events resend", GitHub's "Redeliver", GitLab's
// "Resend request") and look for the header in its delivery log. The
// package's tests check every preset against the senders' own libraries,
// and run a redelivery run through a lossy network on memory, PostgreSQL
// and Redis (go test ./webhook -run TestRedelivery -webhook.long; the
// figures are in RELIABILITY.md).
package webhook
