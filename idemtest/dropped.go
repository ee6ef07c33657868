package idemtest

import (
	"errors"
	"fmt"
	"net/http"
)

// droppedResponse plays a client whose timeout fires DropAfter after it sent
// the request: it closes the connection with a reset, without reading
// anything, and retries with the same key.
//
// What the retry must get depends on what the target did, which the kit
// learns by listening on the connection until it closes it. If the whole
// answer had come by then, the request ran and its answer was lost on the
// way: the retry must get exactly that answer. If not, the target saw its
// client go away while it handled the request, or before it started: the
// retry may wait (409) for the first to finish, and then gets its replay, or
// runs the request if the first never ran; either way the key must settle on
// one answer.
func (r *runner) droppedResponse() Result {
	q := r.keyed(0)
	first := r.sendDropped(q)
	answered := first.err == nil
	sent := fmt.Sprintf("%s, on a raw connection, closed %v later without the answer being read; then the same request again, repeated while it gets 409, and once more",
		r.describe(q), r.t.DropAfter)
	if !answered && !errors.Is(first.err, errNotAnswered) {
		return fail(sent, r.describeAnswer(first), "", "The request could not be sent on a raw connection.")
	}
	if answered && !first.ok() {
		return fail(sent, "before the close: "+r.describeAnswer(first), wantSuccess, "The dropped request was answered, but did not succeed.")
	}
	b, conflicts := r.settle(q)
	c := r.send(q)
	gotFirst := "nothing before the close"
	if answered {
		gotFirst = "before the close (unread by the client): " + r.describeAnswer(first)
	}
	got := gotFirst + "\nthen " + conflictsThen(conflicts) + r.describeAnswer(b) + "\nthen " + r.describeAnswer(c)

	if answered {
		const want = "the dropped answer's status and body, replayed to both retries"
		switch {
		case b.same(first) && c.same(first):
			return pass(sent, got, want, "The request ran, its answer was lost on the way, and the retries got it.")
		case b.err == nil && b.status == http.StatusConflict:
			return fail(sent, got, want, fmt.Sprintf("The key was still in flight %v after the request was answered.", r.t.Patience))
		case b.ok() && !b.same(first):
			return fail(sent, got, want, "The retry got another answer: the request, which had run, ran again.")
		}
		return fail(sent, got, want, "The retries did not get the dropped answer.")
	}

	const want = "a success (the dropped request's answer, or its first execution if it never ran), replayed to the next retry"
	switch {
	case b.err == nil && b.status == http.StatusConflict:
		return fail(sent, got, want, fmt.Sprintf("The key was still in flight %v after the client went away: the target neither finished the request nor released the key.", r.t.Patience))
	case !b.ok():
		return fail(sent, got, want, "The retry did not succeed.")
	case !c.same(b):
		return fail(sent, got, want, "The next retry did not get the retry's answer: the request ran again.")
	}
	look := " Look for key " + q.key + " in the target's records to tell."
	waited := "The first request was still in flight when the retry came (" + conflictsSeen(conflicts) + ")"
	switch {
	case r.marked(b) && conflicts > 0:
		return pass(sent, got, want, waited+", and the retries then got its answer, marked as a replay: the request ran once.")
	case r.marked(b):
		return pass(sent, got, want, "The retries got the first request's answer, marked as a replay: the request ran once, although its client went away.")
	case conflicts > 0 && r.marks == yes:
		return pass(sent, got, want, waited+"; then the retry ran the request afresh (its answer is not marked as a replay, and this target marks its replays): "+
			"the target released the key of the request whose client went away. If that request had done its work before it stopped, the request ran twice."+look)
	case conflicts > 0:
		return pass(sent, got, want, waited+"; then the retries got a success, the same twice, not marked as a replay. "+
			"It is the first request's answer, or a second execution after the target released the key: without a replay header the kit cannot tell."+look)
	case r.marks == yes:
		return pass(sent, got, want, "The retry ran the request (its answer is not marked as a replay, and this target marks its replays), and no 409 came first. "+
			"Either the first request never reached the code that runs it (the target saw its client go first, which is allowed), "+
			"or the target forgot it when its client went away, and the request ran twice."+look)
	}
	return pass(sent, got, want, "The retries got a success, the same twice, not marked as a replay, and no 409 came first: "+
		"it is the first request's answer, or a second execution, and without a replay header the kit cannot tell which."+look)
}
