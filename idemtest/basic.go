package idemtest

import (
	"bytes"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

const (
	wantSuccess = "2xx"
	wantReplay  = "the first answer's status and body, replayed"
)

// firstRequest sends the request once with a fresh key of each form the
// target's declarations allow. It is the precondition of most other checks:
// they use the forms that succeeded, and the answers tell whether two
// executions of the request answer differently.
func (r *runner) firstRequest() Result {
	var sent, got []string
	var failed []string
	var ok []answer
	for _, f := range r.forms {
		q := r.withKey(0, f.make())
		q.form = f.name
		a := r.send(q)
		sent = append(sent, r.describe(q))
		got = append(got, r.describeAnswer(a))
		if !a.ok() {
			failed = append(failed, fmt.Sprintf("%s (%s)", f.name, shortAnswer(a)))
			r.firstStatuses = append(r.firstStatuses, a.status)
			continue
		}
		r.working = append(r.working, f)
		r.firsts = append(r.firsts, seen{checkFirstRequest, q, a})
		ok = append(ok, a)
	}
	if len(ok) == 1 {
		// A second execution under another key tells whether two
		// executions answer differently, which the later checks need to
		// tell a replay from an execution.
		f := r.working[0]
		q := r.withKey(0, f.make())
		q.form = f.name
		a := r.send(q)
		sent = append(sent, r.describe(q))
		got = append(got, r.describeAnswer(a))
		if a.ok() {
			r.firsts = append(r.firsts, seen{checkFirstRequest, q, a})
			ok = append(ok, a)
		}
	}
	if len(ok) > 0 {
		r.first = &r.firsts[0].a
	}
	if len(ok) > 1 {
		r.distinct = no
		for i, a := range ok {
			if !sameAsAny(a, ok[:i]) && i > 0 {
				r.distinct = yes
			}
		}
	}
	res := pass(strings.Join(sent, "\n"), strings.Join(got, "\n"), wantSuccess+" for each", "")
	switch {
	case len(ok) == 0:
		res = fail(res.Sent, res.Got, res.Want,
			"The request did not succeed, so the checks that need it cannot run: check the target's URL, method, headers and body.")
	case len(failed) > 0:
		var names []string
		for _, f := range r.working {
			names = append(names, f.name)
		}
		res = fail(res.Sent, res.Got, res.Want, "Not every valid key was taken: "+strings.Join(failed, ", ")+
			". If the target documents a key length or alphabet, declare it (Target.MinKeyLen, MaxKeyLen and KeyAlphabet; idemcheck -min-key-len, -max-key-len and -key-alphabet). "+
			"The other checks send the keys that were taken: "+strings.Join(names, ", ")+".")
	}
	return res
}

// replay repeats each request of the first-request check, with its key and
// body, and expects the first answer back.
func (r *runner) replay() Result {
	var sent, got []string
	var bad outcomes // by detail, the forms of key that got it
	unseen := false
	for _, s := range r.firsts {
		q, a := s.q, s.a
		sent = append(sent, r.describe(q)+"; then the same again")
		b, conflicts := r.settle(q)
		r.saw(checkReplay, q, b)
		got = append(got, r.describeAnswer(a)+"; then "+conflictsThen(conflicts)+r.describeAnswer(b))
		if !b.same(a) {
			detail := "The repeat did not get the first answer back."
			switch {
			case b.ok() && b.status == a.status && !r.marked(b):
				r.ranAgain = true
				detail = "The repeat got another body: the request ran again."
			case b.status == http.StatusConflict:
				detail = fmt.Sprintf("The key was still in flight after %v, long after the first answer came.", r.t.Patience)
			}
			bad.add(detail, q.form)
			continue
		}
		if r.original == nil {
			r.original, r.replayed = &s.a, &b
			r.marks = triOf(r.marked(b))
		}
		if r.marked(b) || r.distinct == yes {
			r.keyEffect = true
		} else {
			unseen = true
		}
		if changes, brief := headerChanges(a, b); len(changes) > 0 {
			got[len(got)-1] += "\n" + strings.Join(changes, "\n")
			bad.add("The replay's headers differ from the first answer's: "+strings.Join(brief, "; ")+
				". A client that reads them (the Location of what it created, the ETag of what it got) gets them only if its first attempt's answer reached it.", q.form)
		}
	}
	res := pass(strings.Join(sent, "\n"), strings.Join(got, "\n"), wantReplay, "")
	switch {
	case len(bad) > 0:
		res = fail(res.Sent, res.Got, res.Want, bad.byForm(len(r.firsts)))
	case unseen:
		res = inconclusive(res.Sent, res.Got, res.Want, "The answers are equal, but so were the answers to two requests under different keys, and the repeat is not marked as a replay: "+
			"from outside, a replay cannot be told from a second execution. An answer that names what the request created (an ID) would tell them apart.")
	}
	return res
}

// replayedHeaders are the headers a replay must carry as the first answer
// did: where the created resource is, and the representation metadata and
// validators of the body (RFC 9110, sections 8 and 10.2).
var replayedHeaders = [...]string{
	"Location", "Content-Location", "Content-Type", "Content-Encoding", "Content-Language", "ETag", "Last-Modified",
}

// headerChanges describes how the replayedHeaders of replay differ from
// those of first, with their values and, in brief, without.
func headerChanges(first, replay answer) (changes, brief []string) {
	for _, name := range replayedHeaders {
		was, now := first.header.Values(name), replay.header.Values(name)
		before, after := clip(strings.Join(was, ", ")), clip(strings.Join(now, ", "))
		switch {
		case len(was) == 0 && len(now) == 0:
		case len(now) == 0:
			changes = append(changes, name+" "+before+" was dropped")
			brief = append(brief, name+" was dropped")
		case len(was) == 0:
			changes = append(changes, name+" "+after+" was added")
			brief = append(brief, name+" was added")
		case !sameHeader(name, was, now):
			changes = append(changes, name+" "+before+" became "+after)
			brief = append(brief, name+" changed")
		}
	}
	return changes, brief
}

// sameHeader compares two values of a header: a media type by its type and
// parameters, which are not case-sensitive but for the parameters' values,
// and other headers as written.
func sameHeader(name string, a, b []string) bool {
	if name != "Content-Type" || len(a) != 1 || len(b) != 1 {
		return slices.Equal(a, b)
	}
	ta, pa, erra := mime.ParseMediaType(a[0])
	tb, pb, errb := mime.ParseMediaType(b[0])
	if erra != nil || errb != nil {
		return a[0] == b[0]
	}
	return ta == tb && maps.Equal(pa, pb)
}

// conflictsThen describes the 409s that settle waited out, if any, before
// the answer that follows.
func conflictsThen(n int) string {
	if n == 0 {
		return ""
	}
	return conflictsSeen(n) + ", then "
}

// conflictsSeen describes n 409s.
func conflictsSeen(n int) string {
	if n == 1 {
		return "409 Conflict (in flight)"
	}
	return strconv.Itoa(n) + " × 409 Conflict (in flight)"
}

func (r *runner) replayMarked() Result {
	if r.replayed == nil {
		return notApplicable("No replay was seen: the " + checkReplay + " check did not run or did not pass.")
	}
	got := r.describeAnswer(*r.original) + "; then " + r.describeAnswer(*r.replayed)
	want := r.t.ReplayedHeader + ": true on the replay only"
	switch {
	case r.marked(*r.original):
		return fail("", got, want, "The first answer, which ran the request, is marked as a replay.")
	case !r.marked(*r.replayed):
		return fail("", got, want, "The replay is not marked with "+r.t.ReplayedHeader+" or one of its common spellings"+
			": a client cannot tell whether its retry ran the request or got the stored answer.")
	}
	name := r.marker(*r.replayed)
	if name != r.t.ReplayedHeader {
		return pass("", got, want, "The replay is marked with "+name+", not "+r.t.ReplayedHeader+".")
	}
	return pass("", got, want, "The replay is marked with "+name+".")
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
	r.saw(checkKeyMismatch, other, b)
	got := r.describeAnswer(a) + "; then " + conflictsThen(conflicts) + r.describeAnswer(b)
	switch {
	case b.status == http.StatusUnprocessableEntity && b.err == nil:
		return pass(sent, got, want, "")
	case b.ok() && (b.same(a) || r.marked(b)):
		detail := "The different request got the first request's answer: the target does not compare the requests it sees under one key."
		if bytes.Equal(bytes.TrimSpace(r.body[0]), bytes.TrimSpace(r.body[1])) {
			detail += " (The two bodies differ only in white space: if the target fingerprints parsed JSON, give the body a " + placeholder + " placeholder.)"
		}
		return fail(sent, got, want, detail)
	case b.ok():
		return fail(sent, got, want, "The different request ran under a key already used.")
	case refused(b):
		r.keyEffect = true
		return advise(sent, got, want, fmt.Sprintf("The different request was refused, but with %d, not the 422 that the draft recommends.", b.status))
	}
	return fail(sent, got, want, "The different request was not refused with 422.")
}

// refused reports whether a is a client error: the request was refused and
// should not be retried as it is. 408, 409, 425 and 429 are not refusals:
// they ask for a retry.
func refused(a answer) bool {
	switch a.status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return a.err == nil && a.status >= 400 && a.status < 500
}

func (r *runner) missingKey() Result {
	if r.t.KeysOptional {
		return notApplicable("Keys are optional for this target (Target.KeysOptional): it runs a request without a key, unprotected.")
	}
	q := r.keyless(0)
	a := r.send(q)
	r.saw(checkMissingKey, q, a)
	sent, got := r.describe(q), r.describeAnswer(a)
	const want = "400 Bad Request"
	switch {
	case a.status == http.StatusBadRequest && a.err == nil && r.refusedValid(a):
		return inconclusive(sent, got, want, "Refused with 400, but so were the requests with a valid key (see "+checkFirstRequest+"): the refusal may not be for the missing key.")
	case a.status == http.StatusBadRequest && a.err == nil:
		return pass(sent, got, want, "")
	case a.ok() && r.marked(a):
		return fail(sent, got, want, "The request without a key got a stored answer (marked as a replay), as if no key were a key used before: requests without a key share one record.")
	case a.ok():
		return fail(sent, got, want, "The request ran without a key. If keys are optional for this target, say so (Target.KeysOptional, idemcheck -keys-optional).")
	case refused(a) && a.status != http.StatusUnauthorized && a.status != http.StatusForbidden:
		r.keyEffect = true
		return advise(sent, got, want, fmt.Sprintf("The request without a key was refused, but with %d, not the 400 that the draft recommends.", a.status))
	}
	return fail(sent, got, want, "The request without a key was not refused with 400.")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
