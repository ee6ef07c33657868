package idemtest

import (
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

// concurrent sends Concurrency identical requests at once. It opens a
// connection for each first, then writes every request as soon as all are
// open, so that they reach the target together rather than as fast as a
// client's pool would dial.
func (r *runner) concurrent() Result {
	n := r.t.Concurrency
	q := r.keyed(0)
	sent := strconv.Itoa(n) + " at once, each on a raw connection opened beforehand: " + r.describe(q)
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, _, err := r.dial(ctx)
		if err != nil {
			return fail(sent, "no connection: "+err.Error(), "", fmt.Sprintf("Could not open %d connections to the target.", n))
		}
		conns = append(conns, c)
	}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
	})
	defer stop()

	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			<-start
			answers[i] = r.exchange(ctx, c, q)
		})
	}
	close(start)
	wg.Wait()

	const want = "one effect: successes that all have the same status and body (a single one where replays are marked), and 409 Conflict for the others"
	var successes []answer
	unmarked := 0
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
	detail := ""
	if unmarked > 1 && r.distinct != yes {
		detail = fmt.Sprintf("%d equal successes, not marked as replays: they are replays only if two executions of the request would answer differently, which the kit could not see.", unmarked)
	}
	return pass(sent, got, want, detail)
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
