package idemtest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

const (
	wantSuccess = "2xx"
	wantReplay  = "the first answer's status and body, replayed"
)

func (r *runner) firstRequest() Result {
	q := r.keyed(0)
	a := r.send(q)
	sent, got := r.describe(q), r.describeAnswer(a)
	if !a.ok() {
		return fail(sent, got, wantSuccess,
			"The request did not succeed, so the checks that need it cannot run: check the target's URL, method, headers and body.")
	}
	r.first = &a
	return pass(sent, got, wantSuccess, "")
}

func (r *runner) replay() Result {
	q := r.keyed(0)
	a := r.send(q)
	sent := r.describe(q) + "; then the same again"
	if !a.ok() {
		return fail(sent, r.describeAnswer(a), wantSuccess+", then "+wantReplay,
			"The first request with the key did not succeed.")
	}
	if r.first != nil {
		r.distinct = triOf(!a.same(*r.first))
	}
	b, conflicts := r.settle(q)
	got := r.describeAnswer(a) + "; then " + conflictsThen(conflicts) + r.describeAnswer(b)
	if !b.same(a) {
		detail := "The repeat did not get the first answer back."
		switch {
		case b.ok() && b.status == a.status:
			detail = "The repeat got another body: the request ran again."
		case b.status == http.StatusConflict:
			detail = fmt.Sprintf("The key was still in flight after %v, long after the first answer came.", r.t.Patience)
		}
		return fail(sent, got, wantReplay, detail)
	}
	r.original, r.replayed = &a, &b
	r.marks = triOf(r.marked(b))
	detail := ""
	if r.marks == no && r.distinct == no {
		detail = "The answers are equal, but so were the answers to two requests under different keys, and the repeat is not marked as a replay: " +
			"from outside, a replay cannot be told from a second execution. An answer that names what the request created (an ID) would tell them apart."
	}
	return pass(sent, got, wantReplay, detail)
}

// conflictsThen describes the 409s that settle waited out.
func conflictsThen(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "409 Conflict (in flight), then "
	}
	return strconv.Itoa(n) + " × 409 Conflict (in flight), then "
}

func (r *runner) replayMarked() Result {
	if r.replayed == nil {
		return notApplicable("No replay was seen: the " + CheckReplay + " check did not run or did not pass.")
	}
	got := r.describeAnswer(*r.original) + "; then " + r.describeAnswer(*r.replayed)
	want := r.t.ReplayHeader + ": true on the replay only"
	switch {
	case r.marked(*r.original):
		return fail("", got, want, "The first answer, which ran the request, is marked as a replay.")
	case !r.marked(*r.replayed):
		return fail("", got, want, "The replay is not marked with "+r.t.ReplayHeader+
			": a client cannot tell whether its retry ran the request or got the stored answer.")
	}
	return pass("", got, want, "")
}

func (r *runner) keyMismatch() Result {
	q := r.keyed(0)
	a := r.send(q)
	other := r.variantOf(q, 1)
	sent := r.describe(q) + "; then " + r.describe(other)
	const want = "422 Unprocessable Entity, and the second request does not run"
	if !a.ok() {
		return fail(sent, r.describeAnswer(a), wantSuccess+", then 422", "The first request with the key did not succeed.")
	}
	b, conflicts := r.settle(other)
	r.saw(CheckKeyMismatch, other, b)
	got := r.describeAnswer(a) + "; then " + conflictsThen(conflicts) + r.describeAnswer(b)
	switch {
	case b.status == http.StatusUnprocessableEntity && b.err == nil:
		return pass(sent, got, want, "")
	case b.ok() && (b.same(a) || r.marked(b)):
		return fail(sent, got, want, "The different request got the first request's answer: the target does not compare the requests it sees under one key. "+
			"(If the target fingerprints parsed JSON and the two bodies differ only in white space, give the body a "+Placeholder+" placeholder.)")
	case b.ok():
		return fail(sent, got, want, "The different request ran under a key already used.")
	}
	return fail(sent, got, want, "The different request was not refused with 422.")
}

func (r *runner) missingKey() Result {
	if r.t.KeysOptional {
		return notApplicable("Keys are optional for this target (Target.KeysOptional): it runs a request without a key, unprotected.")
	}
	q := r.keyless(0)
	a := r.send(q)
	r.saw(CheckMissingKey, q, a)
	sent, got := r.describe(q), r.describeAnswer(a)
	const want = "400 Bad Request"
	switch {
	case a.status == http.StatusBadRequest && a.err == nil:
		return pass(sent, got, want, "")
	case a.ok():
		return fail(sent, got, want, "The request ran without a key. If keys are optional for this target, say so (Target.KeysOptional, idemcheck -keys-optional).")
	}
	return fail(sent, got, want, "The request without a key was not refused with 400.")
}

func (r *runner) malformedKey() Result {
	long := newKey()
	long += strings.Repeat("k", 256-len(long))
	probes := []struct {
		q   request
		raw bool
	}{
		{r.withKey(0, ""), false},
		{r.withKey(0, long), false},
		{r.withKey(0, "idemtest\x01"+newKey()), true},
	}
	probes[0].q.keyText = "(empty)"
	probes[1].q.keyText = long[:36] + "kkk... (256 bytes)"
	probes[2].q.keyText = strconv.Quote(probes[2].q.key) + " (on a raw connection)"

	var sent, got, bad []string
	for _, p := range probes {
		var a answer
		if p.raw {
			// Not evidence for problem-json: many HTTP servers refuse
			// a control character themselves, before any handler.
			a = r.sendRaw(p.q)
		} else {
			a = r.send(p.q)
			r.saw(CheckMalformedKey, p.q, a)
		}
		sent = append(sent, r.describe(p.q))
		got = append(got, r.describeAnswer(a))
		if a.status != http.StatusBadRequest || a.err != nil {
			what := "was not refused with 400"
			if a.ok() {
				what = "ran"
			}
			bad = append(bad, fmt.Sprintf("the request with the %s key %s", []string{"empty", "256-byte", "control-character"}[len(sent)-1], what))
		}
	}
	const want = "400 Bad Request for each"
	res := pass(strings.Join(sent, "\n"), strings.Join(got, "\n"), want, "")
	if len(bad) > 0 {
		res = fail(res.Sent, res.Got, want, capitalize(strings.Join(bad, "; "))+".")
	}
	return res
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
