// Package idemtest checks that an HTTP endpoint honours the Idempotency-Key
// protocol, whatever language it is written in: it speaks only HTTP.
//
// Like testing/fstest.TestFS, Check runs every check against the target and
// reports every violation together, so the same report serves a Go test and
// a program. The command idemcheck
// (github.com/idemkit/idempotency/cmd/idemcheck) is such a program.
//
// # The checks
//
// Each check has a stable name (the Check... constants; Checks describes
// them) and ends as pass, fail, not applicable (Result.Detail says why),
// advisory (a recommendation, or a policy the Target does not require, that
// the target does not follow), or inconclusive (the check ran but could not
// tell; Result.Detail says what would make it tell). Only a fail makes
// Report.Err fail. Each check uses fresh random keys of its own (replay
// repeats first-request's requests, with their keys). A check
// that uses what another learns (whether two executions answer
// differently, whether replays are marked, which keys the target takes)
// runs that one first, unreported, when it was not asked for: each check
// run alone (Target.Checks) establishes its own preconditions, and says
// inconclusive when it still cannot tell.
//
// The checks that need a valid key send keys of several lengths and forms:
// 12, 36 (a UUID), 64 and 255 bytes, and a key as stripe-go makes them,
// those within Policy.MinKeyLen and Policy.MaxKeyLen, with the "utf8" key
// alphabet a key with non-ASCII characters, and with "bytes" that one and a
// key with bytes that are not UTF-8.
//
//   - first-request: a request with a fresh key of each form succeeds
//     (2xx). The checks that need a success are skipped when none did, and
//     use the forms that succeeded otherwise.
//   - replay: each request of first-request, sent again, gets the first
//     answer's status and body back, and its Location, Content-Location,
//     Content-Type, Content-Encoding, Content-Language, ETag and
//     Last-Modified headers.
//   - replay-marked (advisory): that replay carries Idempotent-Replayed:
//     true (or Idempotency-Replayed, X-Idempotent-Replayed,
//     X-Idempotency-Replayed, which the report names), and the first answer
//     does not.
//   - key-mismatch: the same key with a different body (Body(1)) does not
//     run, and gets 422 (another 4xx is advisory).
//   - missing-key: no key gets 400 (another 4xx is advisory), unless
//     Policy.KeysOptional. A stored answer marked as a replay is named as
//     such, not as a run; a 400 that requests with a valid key got too is
//     inconclusive.
//   - malformed-key: keys that break the draft's syntax but that HTTP
//     parsers let through (empty, with a tab, with a character outside
//     Policy.KeyAlphabet unless it is "bytes", an unclosed quoted
//     string), each of a valid
//     length, and with Policy.MaxKeyLen a key one byte too long and with
//     Policy.MinKeyLen one a byte too short, each get 400. Where keys are
//     optional, a malformed key may instead be ignored, as RFC 8941 says of
//     a field that does not parse, but not used as a key.
//   - key-forms: with Policy.KeyForm "both", a key sent bare and then
//     quoted (and another the other way round) is one key.
//   - concurrent: Target.Concurrency identical requests, released together,
//     have one effect: every success has the same status and body, the
//     others are 409. It passes only when a duplicate was seen reaching the
//     idempotency layer while the first ran there: a 409, or a wait that
//     the timing proves (see What the kit can see). Inconclusive otherwise,
//     with what would make it conclusive.
//   - dropped-response: the kit sends the request, closes the connection
//     after Target.DropAfter without reading the answer, and retries (again
//     while it gets 409, for up to Target.Patience): the retry gets the
//     first's answer, or runs the request if the first never ran, and the
//     key settles on one answer. The detail says what the answers show.
//   - cross-tenant: with Target.SecondCredential, the same key and body sent
//     as another caller run afresh instead of getting the first caller's
//     answer.
//   - 5xx-not-cached: with Target.FailHeader, a request made to fail with a
//     5xx is retried with the same key without the trigger. A key left in
//     flight is a failure; a replayed 5xx is advisory unless
//     Policy.Release5xx (policy release-5xx), since the draft lets a
//     server store errors.
//   - problem-json (advisory): the 400, 409 and 422 answers seen are RFC 9457
//     problem+json documents with type, title and status.
//
// Target.Policy declares what the target does where the draft leaves the
// choice to the server, and Report.Policy records the choices it was
// judged by; Report.Notes holds what the kit noticed about the target as a
// whole, such as every request running as if it had no key (a key header
// of another name?).
//
// # From a Go test
//
// Point the kit at a server, or give it the handler to serve on loopback:
//
//	func TestIdempotencyContract(t *testing.T) {
//		report, err := idemtest.Check(t.Context(), idemtest.Target{
//			Handler:          app.Routes(),
//			Path:             "/orders",
//			Header:           http.Header{"Authorization": {"Bearer test-alice"}, "Content-Type": {"application/json"}},
//			Body:             idemtest.BodyTemplate(`{"sku":"A1","note":"{{variant}}"}`),
//			SecondCredential: http.Header{"Authorization": {"Bearer test-bob"}},
//			FailHeader:       http.Header{"X-Test-Fail": {"1"}},
//		})
//		if err != nil {
//			t.Fatal(err)
//		}
//		if err := report.Err(); err != nil {
//			t.Error(err)
//		}
//	}
//
// Report.Err lists every failed check with what was sent, what came back and
// what the protocol expects; iterate over Report.Results to make a subtest of
// each check instead. The package does not import testing, so that a program
// can use it too.
//
// # From the command line
//
//	idemcheck -H 'Authorization: Bearer test-alice' -H2 'Authorization: Bearer test-bob' \
//		-fail-header 'X-Test-Fail: 1' -d '{"sku":"A1","note":"{{variant}}"}' https://staging.example.com/orders
//
// prints a table of the checks and a summary line, or JSON with -json, and
// exits with status 0 only when no check fails.
//
// # What the kit can see
//
// The kit judges the target by its answers alone. It tells a replay from a
// second execution by the replay header, or by the answers themselves when
// two executions answer differently (an order ID, a timestamp). A target
// whose answers are the same for every execution and that does not mark its
// replays can run a request twice unseen; Result.Detail says so when the kit
// could not tell.
//
// Concurrent duplicates test in-flight protection only if one reaches the
// target's idempotency layer while the first runs there. A server without
// any such protection, which stores an answer once the request has run and
// replays it, answers duplicates that come after the first has finished
// just as a protected one does: their success proves nothing. The
// concurrent check sends each request with Expect: 100-continue and holds
// the bodies until the target has answered 100 Continue to each, then
// releases them together; but a 100 Continue shows only that the server
// will read the body (many send it before any application code, let alone
// the idempotency layer, has seen the key), so it is no evidence of
// overlap. The evidence is a 409, or a wait: the kit times runs of the
// request and a replay alone, and sends, with the duplicates, the same
// request under another key; duplicates answered with the first's answer
// no sooner than half a run after their release, while the request under
// another key ran alongside the first, were held by their key while it
// ran. That needs a run to take at least 50ms more than a replay:
// against a faster endpoint, or a server that handles one request at a
// time, the check is inconclusive, not passed, and says so. Point it at a
// test endpoint whose handler takes 100ms or more (250ms leaves room for a
// loaded machine or a network).
//
// # Before you point it at a server
//
// The checks create what the endpoint creates: about one resource per check
// against a compliant target (more if the target runs duplicates, up to
// Target.Concurrency for the concurrent check). Run the kit against a test or
// staging deployment (the concurrent check creates three more: two requests
// timed alone, and the request under another key). Check first opens a
// connection to the URL's host, and
// reports a host it cannot reach with ErrUnreachable. The concurrent and
// dropped-response checks write their requests on raw connections of the
// kit's own, dialled to the URL's host (with TLS for https, using the TLS
// settings of Target.Client's transport) and speaking HTTP/1.1; they do not
// go through a proxy.
package idemtest
