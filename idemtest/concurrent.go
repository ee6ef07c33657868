package idemtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// continueWait bounds how long the concurrent check waits for the target
// to answer each request's Expect: 100-continue before it sends the bodies
// anyway, as RFC 9110 lets a client do.
const continueWait = time.Second

// concurrent sends Concurrency identical requests at once, and sees whether
// a duplicate reached the target's idempotency layer while the first was
// running there: only then does the check test what it is named for.
//
// It opens a connection for each request first, and one more for a control
// request, the same request under another key. On each it writes the
// request's head with Expect: 100-continue, and holds the body until every
// request has been answered 100 Continue (or continueWait has passed); then
// it writes every body together, so that the requests reach the target
// together rather than as fast as a client would write them. A 100
// Continue shows only that the server is ready to read a body: many
// servers send it before any code of the application, let alone the
// idempotency layer, has seen the key. So it shows no overlap.
//
// The overlap is seen in two ways. A duplicate answered 409 met the first
// in flight. Or the duplicates waited: the kit times lone requests (two
// runs, and a replay) beforehand, and when a run takes markedly longer than
// a replay (minRun or more), duplicates answered with the first's answer no
// sooner than half a run (beyond a replay) after they were sent, while the control, sent with
// them, ran alongside the first, were held by something that told them from
// the control by their key while the first ran. Otherwise the check is
// inconclusive, and says what would make it conclusive: an endpoint that
// takes longer.
//
// A target that refuses the expectation (417) is asked again without it,
// the last byte of each request held instead.
func (r *runner) concurrent() Result {
	alone := r.timeAlone()
	res, again := r.concurrentOnce(true, alone)
	if again {
		res, _ = r.concurrentOnce(false, alone)
	}
	return res
}

// concurrentOnce runs the concurrent check, with Expect: 100-continue when
// expect is true. It reports again when the target refused the
// expectation.
func (r *runner) concurrentOnce(expect bool, alone lone) (res Result, again bool) {
	n := r.t.Concurrency
	q := r.keyed(0)
	control := r.keyed(0)
	how := "the last byte of each held until all were written"
	if expect && len(q.body) > 0 {
		for _, p := range []*request{&q, &control} {
			p.header = p.header.Clone()
			p.header.Set("Expect", "100-continue")
		}
		how = "each with Expect: 100-continue and its body held until all were answered 100 Continue (or " + continueWait.String() + " had passed)"
	} else {
		expect = false
	}
	sent := strconv.Itoa(n) + " at once, each on a raw connection opened beforehand, " + how + ": " + r.describe(q) +
		"\nwith them, the same request under another key: " + r.describe(control) +
		"\nbefore them, alone: " + alone.sent
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()

	// The duplicates are 0 to n-1; the control is n.
	conns := make([]net.Conn, 0, n+1)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n + 1 {
		c, _, err := r.dial(ctx)
		if err != nil {
			return fail(sent, "no connection: "+err.Error(), "", fmt.Sprintf("Could not open %d connections to the target.", n+1)), false
		}
		conns = append(conns, c)
	}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
	})
	defer stop()
	heads := make([][]byte, n+1)
	tails := make([][]byte, n+1)
	reqs := make([]*http.Request, n+1)
	for i := range conns {
		p := q
		if i == n {
			p = control
		}
		raw, req, err := r.wire(ctx, p)
		if err != nil {
			return fail(sent, err.Error(), "", "The request could not be written."), false
		}
		cut := len(raw) - 1
		if expect {
			cut = len(raw) - len(p.body)
		}
		heads[i], tails[i], reqs[i] = raw[:cut], raw[cut:], req
	}
	for i, c := range conns {
		if _, err := c.Write(heads[i]); err != nil {
			return fail(sent, "writing the request: "+err.Error(), "", "The request could not be sent on a raw connection."), false
		}
	}

	answers := make([]answer, n+1)
	readers := make([]*bufio.Reader, n+1)
	answered := make([]bool, n+1) // answered before its body was sent
	continued := 0
	if expect {
		var mu sync.Mutex
		var wg sync.WaitGroup
		deadline := time.Now().Add(continueWait)
		for i, c := range conns {
			readers[i] = bufio.NewReader(c)
			wg.Go(func() {
				c.SetReadDeadline(deadline)
				a, interim := readInterim(readers[i], reqs[i])
				c.SetReadDeadline(time.Time{})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case interim && i < n:
					continued++
				case a.status != 0:
					answers[i], answered[i] = a, true
				}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return fail(sent, "", "", "The check was cut short."), false
		}
		for _, a := range answers {
			if a.status == http.StatusExpectationFailed {
				return Result{}, true
			}
		}
	} else {
		for i, c := range conns {
			readers[i] = bufio.NewReader(c)
		}
	}

	release := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range conns {
		if answered[i] {
			continue
		}
		wg.Go(func() {
			<-release
			_, werr := c.Write(tails[i])
			// A target may answer before the body, and close: its
			// answer is still to be read.
			a := readAnswer(readers[i], reqs[i])
			if werr != nil && a.status == 0 {
				a.err = fmt.Errorf("writing the request: %w", werr)
			}
			answers[i] = a
		})
	}
	released := time.Now()
	close(release)
	wg.Wait()
	controlAnswer := answers[n]
	answers = answers[:n]
	early := slices.Contains(answered[:n], true)

	const want = "one effect: successes that all have the same status and body (a single one where replays are marked), and 409 Conflict for the others; " +
		"and a duplicate seen reaching the idempotency layer while the first ran there: a 409, or a wait as long as the first's run"
	var successes []answer
	unmarked, conflicts := 0, 0
	var other []string
	for _, a := range answers {
		r.saw(checkConcurrent, q, a)
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
	if expect {
		got = fmt.Sprintf("%d of %d answered 100 Continue before any body was sent (which shows no overlap)\n", continued, n) + got
	}
	got += "\nthe request under another key: " + r.describeAnswer(controlAnswer)
	w := judgeWait(alone, released, successes, controlAnswer, early)
	got += "\n" + w.timing
	distinct := 0
	for i, a := range successes {
		if !sameAsAny(a, successes[:i]) {
			distinct++
		}
	}
	switch {
	case distinct > 1:
		return fail(sent, got, want, fmt.Sprintf("%d different successful answers: the request ran at least %d times.", distinct, distinct)), false
	case r.marks == yes && unmarked > 1:
		return fail(sent, got, want, fmt.Sprintf("%d successes are not marked as replays, though this target marks its replays: the request ran %d times.", unmarked, unmarked)), false
	case len(other) > 0:
		return fail(sent, got, want, "Answers other than a success or 409: "+strings.Join(other, "; ")+"."), false
	case len(successes) == 0:
		return fail(sent, got, want, "No request succeeded."), false
	}

	if unmarked > 1 && r.distinct != yes {
		return inconclusive(sent, got, want, fmt.Sprintf("%d equal successes, not marked as replays: they are replays only if two executions of the request would answer differently, which the kit could not see. "+
			"An answer that names what the request created (an ID), or a replay header, would tell them apart.", unmarked)), false
	}
	switch {
	case conflicts > 0:
		return pass(sent, got, want, fmt.Sprintf("%d of %d requests were answered 409 while the first was in flight.", conflicts, n)), false
	case w.waited:
		return pass(sent, got, want, "No 409, but the duplicates waited for the first: "+w.why), false
	}
	return inconclusive(sent, got, want, "No duplicate was seen reaching the idempotency layer while the first ran there: none was answered 409, and "+w.why), false
}

// readInterim reads the first answer to a request sent with Expect:
// 100-continue, before its body: interim is true for 100 Continue. A
// final answer is returned as such; a read that times out returns neither.
func readInterim(br *bufio.Reader, req *http.Request) (a answer, interim bool) {
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return answer{}, false
	}
	if resp.StatusCode == http.StatusContinue {
		return answer{}, true
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		err = fmt.Errorf("reading the body: %w", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body, err: err, at: time.Now()}, false
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
