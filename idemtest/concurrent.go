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
// they were in the target at once.
//
// It opens a connection for each first, and writes on each the request's
// head with Expect: 100-continue. A server answers 100 Continue when it is
// ready to read the body, which net/http does when the handler first reads
// it: a request so answered is in the target, being handled. Once every
// request has its 100 Continue (or continueWait has passed), the kit writes
// every body together, so that the requests reach the target's code
// together rather than as fast as a client would write them. Two requests
// answered 100 Continue before either body was sent were in the target at
// once: the overlap is seen, and not inferred from how long the answers
// took. So is it when a request is answered 409.
//
// A target that refuses the expectation (417) is asked again without it,
// the last byte of each request held instead: only a 409 can then show the
// overlap. A target that handles the requests one after another shows
// none, and the check says so rather than passing.
func (r *runner) concurrent() Result {
	res, again := r.concurrentOnce(true)
	if again {
		res, _ = r.concurrentOnce(false)
	}
	return res
}

// concurrentOnce runs the concurrent check, with Expect: 100-continue when
// expect is true. It reports again when the target refused the
// expectation.
func (r *runner) concurrentOnce(expect bool) (res Result, again bool) {
	n := r.t.Concurrency
	q := r.keyed(0)
	how := "the last byte of each held until all were written"
	if expect && len(q.body) > 0 {
		q.header = q.header.Clone()
		q.header.Set("Expect", "100-continue")
		how = "each with Expect: 100-continue and its body held until all were answered 100 Continue (or " + continueWait.String() + " had passed)"
	} else {
		expect = false
	}
	sent := strconv.Itoa(n) + " at once, each on a raw connection opened beforehand, " + how + ": " + r.describe(q)
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
			return fail(sent, "no connection: "+err.Error(), "", fmt.Sprintf("Could not open %d connections to the target.", n)), false
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
		return fail(sent, err.Error(), "", "The request could not be written."), false
	}
	cut := len(raw) - 1
	if expect {
		cut = len(raw) - len(q.body)
	}
	head, tail := raw[:cut], raw[cut:]
	for _, c := range conns {
		if _, err := c.Write(head); err != nil {
			return fail(sent, "writing the request: "+err.Error(), "", "The request could not be sent on a raw connection."), false
		}
	}

	answers := make([]answer, n)
	readers := make([]*bufio.Reader, n)
	answered := make([]bool, n) // answered before its body was sent
	continued := 0
	if expect {
		var mu sync.Mutex
		var wg sync.WaitGroup
		deadline := time.Now().Add(continueWait)
		for i, c := range conns {
			readers[i] = bufio.NewReader(c)
			wg.Go(func() {
				c.SetReadDeadline(deadline)
				a, interim := readInterim(readers[i], req)
				c.SetReadDeadline(time.Time{})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case interim:
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
			_, werr := c.Write(tail)
			// A target may answer before the body, and close: its
			// answer is still to be read.
			a := readAnswer(readers[i], req)
			if werr != nil && a.status == 0 {
				a.err = fmt.Errorf("writing the request: %w", werr)
			}
			answers[i] = a
		})
	}
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
	if expect {
		got = fmt.Sprintf("%d of %d answered 100 Continue before any body was sent\n", continued, n) + got
	}
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
	case continued > 1:
		return pass(sent, got, want, fmt.Sprintf("No 409, but %d of the requests were in the target at once: each was answered 100 Continue, "+
			"which a server sends when it is ready to read the request's body, before any body was sent. One ran, and the others got its answer (replayed, or after waiting for it).", continued)), false
	}
	seen := "none was answered 409"
	if expect {
		seen += fmt.Sprintf(", and %d of %d was answered 100 Continue before the bodies were sent (within %v)", continued, n, continueWait)
	} else {
		seen += " (the target refused Expect: 100-continue, which would have shown the requests in the target)"
	}
	return inconclusive(sent, got, want, "No request was seen in flight: "+seen+
		". The target may have handled them one after another, so concurrent duplicates were not tested. "+
		"A handler that takes some time (tens of milliseconds, as a write to a database does) or a higher concurrency (Target.Concurrency, idemcheck -n) makes them overlap; run again."), false
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
