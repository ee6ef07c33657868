package idemtest

// The names of the checks, in the order Check runs them. They are stable:
// scripts and reports may rely on them.
const (
	CheckFirstRequest    = "first-request"
	CheckReplay          = "replay"
	CheckReplayMarked    = "replay-marked"
	CheckKeyMismatch     = "key-mismatch"
	CheckMissingKey      = "missing-key"
	CheckMalformedKey    = "malformed-key"
	CheckConcurrent      = "concurrent"
	CheckDroppedResponse = "dropped-response"
	CheckCrossTenant     = "cross-tenant"
	Check5xxNotCached    = "5xx-not-cached"
	CheckProblemJSON     = "problem-json"
)

// CheckInfo describes one check.
type CheckInfo struct {
	// Name is the check's stable name, such as "replay".
	Name string
	// Description says what the check sends and what it expects.
	Description string
	// Advisory is true for a check of a recommendation: its failure is
	// reported with StatusAdvisory and does not make Report.Err fail.
	Advisory bool
}

// check is a CheckInfo and the function that runs it.
type check struct {
	CheckInfo
	// needsSuccess: the check sends the request expecting it to succeed,
	// so it is skipped when first-request has failed.
	needsSuccess bool
	run          func(r *runner) Result
}

// Checks returns the checks that Check runs, in the order it runs them.
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
		{CheckInfo{CheckFirstRequest,
			"A request with a fresh key succeeds (2xx). Most other checks need it to.", false},
			false, (*runner).firstRequest},
		{CheckInfo{CheckReplay,
			"The request is sent twice with the same key; the second answer has the first's status and body.", false},
			true, (*runner).replay},
		{CheckInfo{CheckReplayMarked,
			"The replay seen by the replay check carries the replay header (Idempotent-Replayed: true), and the first answer does not.", true},
			false, (*runner).replayMarked},
		{CheckInfo{CheckKeyMismatch,
			"A key already used is sent with a different body (variant 1); the answer is 422 and nothing runs.", false},
			true, (*runner).keyMismatch},
		{CheckInfo{CheckMissingKey,
			"The request without a key is refused with 400. Not applicable when keys are optional.", false},
			false, (*runner).missingKey},
		{CheckInfo{CheckMalformedKey,
			"Malformed keys are refused with 400: an empty key, a 256-byte key, and a key with a control character (written on a raw connection).", false},
			false, (*runner).malformedKey},
		{CheckInfo{CheckConcurrent,
			"N identical requests with one key are sent at once, on N raw connections opened beforehand; they have one effect: every success has the same status and body (the rest are 409), and where replays are marked, at most one success is unmarked.", false},
			true, (*runner).concurrent},
		{CheckInfo{CheckDroppedResponse,
			"The request is sent on a raw connection, which is closed after a short wait (DropAfter, -drop-after) without the answer being read; a retry with the same key, repeated while it gets 409, then gets the first request's answer, or runs it if the first never ran, and a further retry gets the same answer.", false},
			true, (*runner).droppedResponse},
		{CheckInfo{CheckCrossTenant,
			"The same key and body are sent as two callers (the usual headers, then the second credential); the second runs afresh rather than getting the first caller's answer, and the first still gets its own. Not applicable without a second credential.", false},
			true, (*runner).crossTenant},
		{CheckInfo{Check5xxNotCached,
			"The request is made to fail (a 5xx) with the fail-trigger header, then sent again with the same key without it; the retry runs and succeeds rather than replaying the 5xx. Not applicable without a fail trigger.", false},
			true, (*runner).fiveXXNotCached},
		{CheckInfo{CheckProblemJSON,
			"The 400, 409 and 422 answers seen by the other checks are RFC 9457 problem documents: Content-Type application/problem+json, with type, title and a status equal to the answer's.", true},
			false, (*runner).problemJSON},
	}
}
