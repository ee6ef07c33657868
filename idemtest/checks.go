package idemtest

// The names of the checks, in the order Check runs them. They are stable:
// scripts and reports may rely on them.
const (
	checkFirstRequest    = "first-request"
	checkReplay          = "replay"
	checkReplayMarked    = "replay-marked"
	checkKeyMismatch     = "key-mismatch"
	checkMissingKey      = "missing-key"
	checkMalformedKey    = "malformed-key"
	checkKeyForms        = "key-forms"
	checkConcurrent      = "concurrent"
	checkDroppedResponse = "dropped-response"
	checkCrossTenant     = "cross-tenant"
	check5xxNotCached    = "5xx-not-cached"
	checkProblemJSON     = "problem-json"
)

// policyRelease5xx is the policy that the 5xx-not-cached check judges: a
// retry after a 5xx runs again. Target.Require5xxRelease makes it required.
const policyRelease5xx = "release-5xx"

// CheckInfo describes one check.
type CheckInfo struct {
	// Name is the check's stable name, such as "replay".
	Name string
	// Description says what the check sends and what it expects.
	Description string
	// Advisory is true for a check of a recommendation: its failure is
	// reported with StatusAdvisory and does not make Report.Err fail.
	Advisory bool
	// Policy, when not empty, names the server policy that the check
	// judges, a behaviour that the draft leaves to the server: the check
	// reports a target without it as advisory unless the Target requires
	// the policy. A breach of the protocol that the check finds on the way
	// is a failure all the same.
	Policy string
}

// check is a CheckInfo and the function that runs it.
type check struct {
	CheckInfo
	// needsSuccess: the check sends the request expecting it to succeed,
	// so it is skipped when first-request has failed.
	needsSuccess bool
	run          func(r *runner) Result
	// needs names the checks whose evidence this one uses: Check runs
	// them first, unreported, when they were not asked for.
	needs []string
}

// byName returns the check of that name, which must exist.
func byName(name string) check {
	for _, c := range checks() {
		if c.Name == name {
			return c
		}
	}
	return check{}
}

// Most checks need to know that a request with a valid key succeeds, which
// forms of key the target takes, whether two executions answer differently
// (first-request), and whether the target marks its replays (replay).
var (
	needsFirst = []string{checkFirstRequest}
	needsBoth  = []string{checkFirstRequest, checkReplay}
)

// Checks returns the checks that Check runs, in the order it runs them:
// first-request, replay, replay-marked, key-mismatch, missing-key,
// malformed-key, key-forms, concurrent, dropped-response, cross-tenant,
// 5xx-not-cached and problem-json. Their names are stable: scripts and
// reports may rely on them, and Target.Checks takes them.
func Checks() []CheckInfo {
	all := checks()
	infos := make([]CheckInfo, len(all))
	for i, c := range all {
		infos[i] = c.CheckInfo
	}
	return infos
}

func checks() []check {
	return []check{
		{CheckInfo{Name: checkFirstRequest,
			Description: "A request with a fresh key of each form succeeds (2xx): keys of 12, 36 (a UUID), 64 and 255 bytes and a stripe-go style key, those within the declared lengths, and with the UTF-8 alphabet a key with non-ASCII characters. Most other checks need it to, and use the forms that succeeded."},
			false, (*runner).firstRequest, nil},
		{CheckInfo{Name: checkReplay,
			Description: "Each request of first-request is sent again with its key; the second answer has the first's status and body, and the same Location, Content-Location, Content-Type, Content-Encoding, Content-Language, ETag and Last-Modified headers."},
			true, (*runner).replay, needsFirst},
		{CheckInfo{Name: checkReplayMarked, Advisory: true,
			Description: "The replay seen by the replay check carries a replay header (Idempotent-Replayed: true, or one of its common spellings), and the first answer does not."},
			false, (*runner).replayMarked, needsBoth},
		{CheckInfo{Name: checkKeyMismatch,
			Description: "A key already used is sent with a different body (variant 1); the request does not run, and is refused with 422 (another 4xx is advisory: the draft recommends 422)."},
			true, (*runner).keyMismatch, needsBoth},
		{CheckInfo{Name: checkMissingKey,
			Description: "The request without a key is refused with 400 (another 4xx is advisory). Not applicable when keys are optional."},
			false, (*runner).missingKey, needsFirst},
		{CheckInfo{Name: checkMalformedKey,
			Description: "Keys that break the syntax of the draft's Structured Field string, each of a valid length: an empty key, one with a tab, one with a character outside the declared alphabet, and an unclosed quoted string; and, with declared key lengths, a key one byte over the longest and one under the shortest. Each is refused with 400; where keys are optional, it may instead be ignored (the request runs as if it had no key), but never used as a key."},
			false, (*runner).malformedKey, needsBoth},
		{CheckInfo{Name: checkKeyForms,
			Description: "For a target that accepts keys both bare and quoted: a key sent bare and then quoted, and another sent quoted and then bare, are one key each: the second request gets the first's answer. Not applicable unless both forms are declared (-key-form both)."},
			true, (*runner).keyForms, needsBoth},
		{CheckInfo{Name: checkConcurrent,
			Description: "Two runs of the request and a replay are timed alone; then N identical requests with one key, and the same request under another key, are written at once on raw connections, with Expect: 100-continue, their bodies held until each has been answered 100 Continue (or a second has passed) and then released together. They have one effect: every success has the same status and body (the rest are 409), and where replays are marked, at most one success is unmarked. It passes only when a duplicate was seen reaching the idempotency layer while the first ran there: a 409, or duplicates held as long as a run (which must take at least 50ms more than a replay) while the request under another key ran alongside the first. Otherwise it is inconclusive, and says how to make it conclusive: an endpoint that takes 100ms or more."},
			true, (*runner).concurrent, needsBoth},
		{CheckInfo{Name: checkDroppedResponse,
			Description: "The request is sent on a raw connection, which is closed after a short wait (DropAfter, -drop-after) without the answer being read; a retry with the same key, repeated while it gets 409, then gets the first request's answer, or runs it if the first never ran, and a further retry gets the same answer."},
			true, (*runner).droppedResponse, needsBoth},
		{CheckInfo{Name: checkCrossTenant,
			Description: "The same key and body are sent as two callers (the usual headers, then the second credential); the second runs afresh rather than getting the first caller's answer, and the first still gets its own. Not applicable without a second credential."},
			true, (*runner).crossTenant, needsBoth},
		{CheckInfo{Name: check5xxNotCached, Policy: policyRelease5xx,
			Description: "The request is made to fail (a 5xx) with the fail-trigger header, then sent again with the same key without it. The key must not stay in flight (409) once the failure is answered. Policy release-5xx: the retry runs and succeeds rather than getting the 5xx replayed; advisory unless required (-require-5xx-release), since the draft lets a server store errors. Not applicable without a fail trigger."},
			true, (*runner).fiveXXNotCached, needsBoth},
		{CheckInfo{Name: checkProblemJSON, Advisory: true,
			Description: "The 400, 409 and 422 answers seen by the other checks are RFC 9457 problem documents: Content-Type application/problem+json, with type, title and a status equal to the answer's."},
			false, (*runner).problemJSON, []string{checkKeyMismatch, checkMissingKey, checkMalformedKey}},
	}
}
