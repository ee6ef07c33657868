package idemtest

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

func headerNames(h http.Header) string {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func (r *runner) crossTenant() Result {
	if len(r.t.SecondCredential) == 0 {
		return notApplicable("No second credential was given (Target.SecondCredential, idemcheck -H2).")
	}
	q := r.keyed(0)
	other := overlay(q, r.t.SecondCredential, "as the second caller (its "+headerNames(r.t.SecondCredential)+")")
	sent := r.describe(q) + "\nthen " + r.describe(other) + "\nthen the first again"
	const want = "the second caller's request runs afresh (2xx, not marked as a replay, not the first caller's answer); the first caller's repeat gets its own answer"
	a := r.send(q)
	if !a.ok() {
		return fail(sent, r.describeAnswer(a), want, "The first caller's request did not succeed.")
	}
	b := r.send(other)
	r.saw(checkCrossTenant, other, b)
	c, conflicts := r.settle(q)
	got := r.describeAnswer(a) + "\nthen " + r.describeAnswer(b) + "\nthen " + conflictsThen(conflicts) + r.describeAnswer(c)
	switch {
	case r.marked(b) || (b.same(a) && r.distinct == yes):
		return fail(sent, got, want, "The second caller got the first caller's answer: keys are not scoped to the caller, so one caller can read another's responses.")
	case b.err == nil && (b.status == http.StatusUnprocessableEntity || b.status == http.StatusConflict):
		return fail(sent, got, want, fmt.Sprintf("The second caller's request was refused with %d because the first caller had used its key: keys are not scoped to the caller.", b.status))
	case b.err == nil && (b.status == http.StatusUnauthorized || b.status == http.StatusForbidden):
		return fail(sent, got, want, "The second credential was refused: check Target.SecondCredential (idemcheck -H2).")
	case !b.ok():
		return fail(sent, got, want, "The second caller's request did not succeed.")
	case !c.same(a):
		return fail(sent, got, want, "The first caller's repeat did not get its own answer back.")
	}
	if b.same(a) {
		return inconclusive(sent, got, want, "The two callers got equal answers, not marked as replays; the kit cannot tell whether the second ran afresh, "+
			"because two executions of the request under different keys also answer identically (or too few ran to tell). An answer that names what the request created (an ID) would tell them apart.")
	}
	return pass(sent, got, want, "")
}

func (r *runner) fiveXXNotCached() Result {
	if len(r.t.FailHeader) == 0 {
		return notApplicable("No way to make the target fail was given (Target.FailHeader, idemcheck -fail-header).")
	}
	q := r.keyed(0)
	failing := overlay(q, r.t.FailHeader, "with the fail trigger (its "+headerNames(r.t.FailHeader)+")")
	sent := r.describe(failing) + "\nthen " + r.describe(q)
	policy := "Policy " + policyRelease5xx + ", advisory: the draft lets a server answer a retry with the stored error, as Stripe does; Target.Require5xxRelease (idemcheck -require-5xx-release) makes it required."
	if r.t.Require5xxRelease {
		policy = "Policy " + policyRelease5xx + ", required (Target.Require5xxRelease, idemcheck -require-5xx-release)."
	}
	const want = "a 5xx, then a success that ran the request (not marked as a replay); at the least, not a key left in flight"
	a := r.send(failing)
	if a.err != nil || a.status < 500 || a.status > 599 {
		return fail(sent, r.describeAnswer(a), want, "The fail trigger did not make the target answer 5xx: check Target.FailHeader (idemcheck -fail-header).")
	}
	b, conflicts := r.settle(q)
	r.saw(check5xxNotCached, q, b)
	got := r.describeAnswer(a) + "\nthen " + conflictsThen(conflicts) + r.describeAnswer(b)
	switch {
	case b.err == nil && b.status >= 500 && b.status <= 599 && (b.same(a) || r.marked(b)):
		res := advise(sent, got, want, "The 5xx was stored and replayed: a retry with this key gets the error, never a success. "+policy)
		if r.t.Require5xxRelease {
			res.Status = StatusFail
		}
		return res
	case b.err == nil && b.status == http.StatusConflict:
		return fail(sent, got, want, fmt.Sprintf("The key was still in flight %v after the 5xx was answered: the target neither stored the failure nor released the key, "+
			"so a retry can neither run nor learn the outcome until the key expires. This is a failure whatever the policy: 409 says that the first request is still running, and it is not.", r.t.Patience))
	case b.err == nil && b.status == http.StatusUnprocessableEntity:
		return fail(sent, got, want, "The retry was refused as a different request: either the target counts the fail trigger's headers in its fingerprint (it must not, for this check), or it keeps the failed attempt.")
	case b.ok() && r.marked(b):
		return fail(sent, got, want, "The retry's success is marked as a replay, though the first attempt failed.")
	case !b.ok():
		return fail(sent, got, want, "The retry without the fail trigger did not succeed.")
	}
	return pass(sent, got, want, "The retry ran and succeeded. "+policy)
}
