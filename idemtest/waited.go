package idemtest

import (
	"bufio"
	"context"
	"fmt"
	"time"
)

// minRun is how much longer than a replay a run of the request must take
// for the concurrent check to tell, by timing, duplicates that waited for
// the first from duplicates that came after it: well above the jitter of a
// loaded machine, or of a network. The check's advice, an endpoint that
// takes recommendedRun, leaves room above it.
const (
	minRun         = 50 * time.Millisecond
	recommendedRun = 100 * time.Millisecond
)

// lone is how long the endpoint takes to answer a request alone: a run
// (a fresh key), and a replay.
type lone struct {
	sent        string
	ok          bool   // both succeeded, the second as a replay
	note        string // why not, when not ok
	run, replay time.Duration
}

// timeAlone times a request with a fresh key, the same request again, and
// another with a fresh key, each alone on a connection of its own opened
// beforehand, so that none counts the time to connect. The run is the
// shorter of the two runs, so that a pause of the machine or the network
// during one cannot make a fast endpoint look slow.
func (r *runner) timeAlone() lone {
	q, other := r.keyed(0), r.keyed(0)
	l := lone{sent: r.describe(q) + ", then again; then " + r.describe(other)}
	first, took := r.timed(q)
	if !first.ok() {
		l.note = "a request with a fresh key, sent alone, got " + r.describeAnswer(first)
		return l
	}
	second, again := r.timed(q)
	if !second.same(first) && !(second.ok() && r.marked(second)) {
		l.note = "the same request sent again alone got " + r.describeAnswer(second) + ", not the first's answer replayed"
		return l
	}
	third, took2 := r.timed(other)
	if !third.ok() {
		l.note = "a second request with a fresh key, sent alone, got " + r.describeAnswer(third)
		return l
	}
	l.ok, l.run, l.replay = true, min(took, took2), again
	return l
}

// timed sends q alone on a connection of the kit's own, and returns the
// answer and how long it took, from the first byte written to the last
// read.
func (r *runner) timed(q request) (answer, time.Duration) {
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()
	conn, _, err := r.dial(ctx)
	if err != nil {
		return answer{err: err}, 0
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	start := time.Now()
	req, err := r.writeRaw(ctx, conn, q)
	if err != nil {
		return answer{err: err}, 0
	}
	a := readAnswer(bufio.NewReader(conn), req)
	return a, a.at.Sub(start)
}

// wait is what the timing of the concurrent check shows.
type wait struct {
	waited bool
	why    string // why the duplicates waited, or why the kit cannot tell
	timing string // the times, for the report
}

// judgeWait decides whether the duplicates that succeeded waited for the
// first while it ran at the idempotency layer. They did if a run takes at
// least minRun more than a replay, each success came no sooner than half a
// run after the release (so each duplicate was held about as long as a
// run, far longer than a replay takes), and the control, released with
// them under another key, ran alongside the first: answered within half a
// run of the first answer. A target that handles one request at a time
// holds duplicates too, but the control with them, and it is not judged to
// have waited: its duplicates never met the first at its idempotency
// layer.
func judgeWait(alone lone, released time.Time, successes []answer, control answer, early bool) wait {
	hint := fmt.Sprintf(" Point the check at an endpoint that takes %v or more to run a request (a test endpoint whose handler sleeps, say 250ms): "+
		"a duplicate that arrives while it runs must then be refused (409) or wait for its answer, and the check sees which.", recommendedRun)
	var w wait
	var first, last time.Duration
	for i, a := range successes {
		d := a.at.Sub(released)
		if i == 0 || d < first {
			first = d
		}
		last = max(last, d)
	}
	c := control.at.Sub(released)
	together := fmt.Sprintf("released together, the successes came %v to %v after the release, the request under another key %v after", round(first), round(last), round(c))
	if control.at.IsZero() {
		together = fmt.Sprintf("released together, the successes came %v to %v after the release", round(first), round(last))
	}
	if !alone.ok {
		w.timing = "alone: " + alone.note + "; " + together
		w.why = "the kit could not time the endpoint: " + alone.note + "." + hint
		return w
	}
	w.timing = fmt.Sprintf("alone, a run took %v and its replay %v; ", round(alone.run), round(alone.replay)) + together
	extra := alone.run - alone.replay
	if extra < minRun {
		w.why = fmt.Sprintf("the endpoint runs a request in %v more than it takes to replay one (%v alone, %v for the replay), under the %v that the kit needs to tell a wait from a replay: "+
			"too fast for duplicates released together to meet the first while it ran. "+
			"They reached the idempotency layer after it had finished, and got its answer, which a server without any protection of requests in flight also gives.",
			round(max(extra, 0)), round(alone.run), round(alone.replay), minRun) + hint
		return w
	}
	half := extra / 2
	switch {
	case early:
		w.why = "some duplicates were answered before their body was sent, so their time says nothing." + hint
	case !control.ok():
		w.why = "the request under another key, which shows whether the target runs requests together, did not succeed: the kit cannot tell waiting from queueing." + hint
	case first < alone.replay+half:
		w.why = fmt.Sprintf("a success came %v after the release, sooner than half a run (%v) beyond a replay: nothing shows a duplicate held while the first ran.", round(first), round(half)) + hint
	case c < alone.replay+half || absDuration(c-first) >= half:
		w.why = fmt.Sprintf("the request under another key, released with them, was answered %v after the release, and the first success %v after: not together (a run takes %v). "+
			"The target handled the requests one at a time, so the duplicates never met the first at its idempotency layer, whatever it would do if they did. "+
			"Run the check against the endpoint served as in production, handling requests concurrently, with an endpoint that takes %v or more.",
			round(c), round(first), round(alone.run), recommendedRun)
	default:
		w.waited = true
		w.why = fmt.Sprintf("each success came %v to %v after the release, though a replay alone takes %v, while the request under another key, released with them, "+
			"ran alongside the first (answered %v after the release). The duplicates were held, by their key, while the first ran, and then got its answer.",
			round(first), round(last), round(alone.replay), round(c))
	}
	return w
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// round rounds d for a report: to the millisecond, or the microsecond
// under a millisecond.
func round(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
