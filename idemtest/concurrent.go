package idemtest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// heldMargin is how much longer than twice the quickest answer of the run
// the first answer of the concurrent check must take for the kit to count
// the others, which came after it, as held back until it was done: more than
// a scheduler's or a network's hiccup.
const heldMargin = 25 * time.Millisecond

// concurrent sends Concurrency identical requests at once. It opens a
// connection for each first, writes each request but its last byte, and
// then writes every last byte together, so that the requests reach the
// target's code together rather than as fast as a client would write them.
//
// A target that answers quickly may still handle them one after another;
// the check then saw nothing in flight, and says so rather than passing.
// It counts as seen in flight a 409, and answers held back until the first
// was done: the first answer came late enough after the release (by
// heldMargin more than twice the quickest answer of the run) that the
// others, sent before, would have been answered already had they not
// waited for it.
func (r *runner) concurrent() Result {
	n := r.t.Concurrency
	q := r.keyed(0)
	sent := strconv.Itoa(n) + " at once, each on a raw connection opened beforehand, the last byte of each held until all were written: " + r.describe(q)
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var dialled time.Duration
	for range n {
		start := time.Now()
		c, _, err := r.dial(ctx)
		if err != nil {
			return fail(sent, "no connection: "+err.Error(), "", fmt.Sprintf("Could not open %d connections to the target.", n))
		}
		if d := time.Since(start); dialled == 0 || d < dialled {
			dialled = d
		}
		conns = append(conns, c)
	}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
	})
	defer stop()
	raw, req, err := r.wire(ctx, q)
	if err != nil {
		return fail(sent, err.Error(), "", "The request could not be written.")
	}
	for _, c := range conns {
		if _, err := c.Write(raw[:len(raw)-1]); err != nil {
			return fail(sent, "writing the request: "+err.Error(), "", "The request could not be sent on a raw connection.")
		}
	}

	answers := make([]answer, n)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			<-release
			_, werr := c.Write(raw[len(raw)-1:])
			// A target may answer before the last byte, and close: its
			// answer is still to be read.
			a := readAnswer(bufio.NewReader(c), req)
			if werr != nil && a.status == 0 {
				a.err = fmt.Errorf("writing the request: %w", werr)
			}
			answers[i] = a
		})
	}
	released := time.Now()
	close(release)
	wg.Wait()

	const want = "one effect: successes that all have the same status and body (a single one where replays are marked), and 409 Conflict for the others"
	var successes []answer
	unmarked, conflicts := 0, 0
	var other []string
	for _, a := range answers {
		r.saw(CheckConcurrent, q, a)
		switch {
		case a.ok():
			successes = append(successes, a)
			if !r.marked(a) {
				unmarked++
			}
		case a.err == nil && a.status == http.StatusConflict:
			conflicts++
		default:
			other = append(other, r.describeAnswer(a))
		}
	}
	got := r.tally(answers)
	distinct := 0
	for i, a := range successes {
		if !sameAsAny(a, successes[:i]) {
			distinct++
		}
	}
	switch {
	case distinct > 1:
		return fail(sent, got, want, fmt.Sprintf("%d different successful answers: the request ran at least %d times.", distinct, distinct))
	case r.marks == yes && unmarked > 1:
		return fail(sent, got, want, fmt.Sprintf("%d successes are not marked as replays, though this target marks its replays: the request ran %d times.", unmarked, unmarked))
	case len(other) > 0:
		return fail(sent, got, want, "Answers other than a success or 409: "+strings.Join(other, "; ")+".")
	case len(successes) == 0:
		return fail(sent, got, want, "No request succeeded.")
	}

	unsure := ""
	if unmarked > 1 && r.distinct != yes {
		unsure = fmt.Sprintf(" %d equal successes, not marked as replays: they are replays only if two executions of the request would answer differently, which the kit could not see.", unmarked)
	}
	if conflicts > 0 {
		return pass(sent, got, want, fmt.Sprintf("%d of %d requests were answered 409 while the first was in flight.", conflicts, n)+unsure)
	}
	firstAt := successes[0].at
	for _, a := range successes[1:] {
		if a.at.Before(firstAt) {
			firstAt = a.at
		}
	}
	took := firstAt.Sub(released)
	quickest := r.quickest
	if quickest == 0 {
		quickest = dialled // no answer yet: the network's round trip
	}
	held := took >= 2*quickest+heldMargin
	took, quickest = took.Round(10*time.Microsecond), quickest.Round(10*time.Microsecond)
	if held {
		return pass(sent, got, want, fmt.Sprintf("No 409, but the first answer took %v, and the others came after it: they waited for it (the quickest answer in this run took %v).", took, quickest)+unsure)
	}
	return inconclusive(sent, got, want, fmt.Sprintf("No request was seen in flight: none was answered 409, and the first answer came %v after the release, "+
		"too soon to show that the others waited for it (the quickest answer in this run took %v). The target may have handled them one after another, "+
		"so concurrent duplicates were not tested. Slow the endpoint down (a handler that takes %v or more) or raise the concurrency (Target.Concurrency, idemcheck -n), and run again.",
		took, quickest, (2*quickest+heldMargin).Round(time.Millisecond))+unsure)
}

func sameAsAny(a answer, others []answer) bool {
	for _, o := range others {
		if a.same(o) {
			return true
		}
	}
	return false
}

// tally describes answers grouped: "1 × 201 Created ...; 9 × 409 Conflict ...".
func (r *runner) tally(answers []answer) string {
	type group struct {
		text  string
		count int
	}
	var groups []group
next:
	for _, a := range answers {
		text := r.describeAnswer(a)
		if a.status == http.StatusConflict {
			text = "409 Conflict" // their bodies and headers say nothing more
		}
		for i := range groups {
			if groups[i].text == text {
				groups[i].count++
				continue next
			}
		}
		groups = append(groups, group{text, 1})
	}
	slices.SortStableFunc(groups, func(a, b group) int { return b.count - a.count })
	lines := make([]string, len(groups))
	for i, g := range groups {
		lines[i] = strconv.Itoa(g.count) + " × " + g.text
	}
	return strings.Join(lines, "\n")
}
