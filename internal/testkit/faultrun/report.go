package faultrun

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
)

// Report is what a Run observed.
type Report struct {
	Seed   uint64
	Orders int

	// Executions counts the API's executions; Duplicated the orders that
	// ran more than once, and Duplicates the executions beyond the first.
	Executions, Duplicated, Duplicates int
	// Lost counts the orders that never ran, or that their caller never
	// saw confirmed, or whose confirmation names an order number other
	// than the one the API made for them. Unconfirmed counts the orders
	// never confirmed, among them.
	Lost, Unconfirmed int
	lost              []string // a few of them, for the problems

	// ConfirmedUnderFaults and ConfirmedAfter count the orders confirmed
	// while the faults were on and after they stopped.
	ConfirmedUnderFaults, ConfirmedAfter int

	// Attempts is the client's attempts for all orders, before the audit;
	// AttemptsPerOrder and CallsPerOrder are per order (a call is one
	// call of the client, which makes one or more attempts).
	Attempts                        int
	AttemptsPerOrder, CallsPerOrder Spread
	// Duration is per order, from its first call to its confirmation.
	Duration DurationSpread

	// Network is what the proxy between the client and the API did before
	// the audit; Amplification is its Requests per order.
	Network       faultnet.Stats
	Amplification float64
	// Faults is what the seed decided: the fault the network gave each
	// key's 1st, 2nd, ... request while the faults were on. How many
	// requests a key sent depends on timing; the fault of its k'th
	// request does not.
	Faults map[string][]faultnet.Fault

	// ClientAnswers counts what the client's attempts came to, before the
	// audit: a status ("201", "201 replayed", "409", "503"), or "timeout",
	// "reset", "no answer", "error". ServerAnswers counts the middleware's
	// statuses, "201 ran" for those whose handler ran.
	ClientAnswers, ServerAnswers map[string]int
	// ServerLogged counts the middleware's log records by message, such
	// as a response it could not store.
	ServerLogged map[string]int

	// Windows says what each window did.
	Windows []WindowReport
	// RefusedButRan counts the requests answered 503 whose handler ran.
	RefusedButRan int

	// AuditFailed counts the orders that the audit could not get an answer
	// for; AuditMismatched those answered with anything but a replay of
	// their confirmation.
	AuditFailed, AuditMismatched int
	mismatched                   []string

	// UnderFaults and Settling are the lengths of the first two phases.
	UnderFaults, Settling time.Duration
}

// WindowReport is what happened in one Window.
type WindowReport struct {
	Window
	Start, End time.Time

	// Requests counts the requests that reached the API during the
	// window; Refused those answered 503 without running the handler; Ran
	// those whose handler ran (their Claim was answered before the fault
	// or, by a store client that retries, after it); Other the rest.
	Requests, Refused, Ran, Other int

	// Checked counts the requests that reached the API at least a store
	// timeout before the window ended, whose every store call met the
	// fault: each must be refused with 503 and run nothing. Violations
	// counts those that were not.
	Checked, Violations int
	violations          map[string]int
}

// Spread summarises a count per order.
type Spread struct {
	Mean          float64
	P50, P99, Max int
}

// DurationSpread summarises a duration per order.
type DurationSpread struct {
	P50, P99, Max time.Duration
}

// tally fills in the report from the orders and the API's executions.
func (r *runner) tally(rep *Report, api *Orders) {
	rep.Executions = api.Total()
	var attempts, calls []int
	var durations []time.Duration
	for _, o := range r.orders {
		ids := api.Executions(o.ref)
		if n := len(ids); n > 1 {
			rep.Duplicated++
			rep.Duplicates += n - 1
		}
		switch o.phase {
		case 1:
			rep.ConfirmedUnderFaults++
		case 2:
			rep.ConfirmedAfter++
		default:
			rep.Unconfirmed++
		}
		if len(ids) == 0 || o.phase == 0 || !slices.Contains(ids, o.id) {
			rep.Lost++
			if len(rep.lost) < 5 {
				rep.lost = append(rep.lost, fmt.Sprintf("%s: executions %v, confirmed %d", o.ref, ids, o.id))
			}
		}
		rep.Attempts += o.attempts
		attempts = append(attempts, o.attempts)
		calls = append(calls, o.calls)
		if o.phase != 0 {
			durations = append(durations, o.confirmed.Sub(o.first))
		}
	}
	rep.AttemptsPerOrder = spread(attempts)
	rep.CallsPerOrder = spread(calls)
	rep.Duration = durationSpread(durations)

	for _, ev := range r.log.within(time.Time{}, time.Now()) {
		if ev.ran && ev.status == http.StatusServiceUnavailable {
			rep.RefusedButRan++
		}
	}
	for i := range rep.Windows {
		w := &rep.Windows[i]
		for _, ev := range r.log.within(w.Start, w.End) {
			w.Requests++
			switch {
			case ev.ran:
				w.Ran++
			case ev.status == http.StatusServiceUnavailable:
				w.Refused++
			default:
				w.Other++
			}
		}
		if w.Fault == Blackhole {
			continue
		}
		w.violations = map[string]int{}
		for _, ev := range r.log.within(w.Start, w.End.Add(-r.cfg.StoreTimeout-checkMargin)) {
			w.Checked++
			if ev.ran || ev.status != http.StatusServiceUnavailable {
				w.Violations++
				w.violations[fmt.Sprintf("%d ran=%v", ev.status, ev.ran)]++
			}
		}
	}
}

// checkMargin is the time, beyond the store timeout, that a request may take
// between its arrival and its Claim.
const checkMargin = 100 * time.Millisecond

// Problems returns every way in which the run broke the promise that a
// retried operation takes effect once: duplicates, lost orders, replays
// that differ from the confirmation, requests answered 503 that ran, and
// requests that met a store fault with every store call and ran or were
// answered with anything but 503. It is empty when all held.
func (rep *Report) Problems() []string {
	var p []string
	if rep.Duplicates > 0 {
		p = append(p, fmt.Sprintf("%d orders ran more than once (%d executions too many)", rep.Duplicated, rep.Duplicates))
	}
	if rep.Lost > 0 {
		p = append(p, fmt.Sprintf("%d orders lost (%d never confirmed), such as %s", rep.Lost, rep.Unconfirmed, strings.Join(rep.lost, "; ")))
	}
	if rep.AuditFailed > 0 || rep.AuditMismatched > 0 {
		p = append(p, fmt.Sprintf("audit: %d orders unanswered, %d answered with other than the replay of their confirmation (%s)",
			rep.AuditFailed, rep.AuditMismatched, strings.Join(rep.mismatched, "; ")))
	}
	if rep.RefusedButRan > 0 {
		p = append(p, fmt.Sprintf("%d requests answered 503 ran the handler", rep.RefusedButRan))
	}
	for _, w := range rep.Windows {
		if w.Violations > 0 {
			p = append(p, fmt.Sprintf("%v: of %d requests that met the fault with every store call, %d were not refused with 503 without running (%v)",
				w.Fault, w.Checked, w.Violations, w.violations))
		}
	}
	return p
}

// String is the report as a few lines of text.
func (rep *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d orders, %d executions, %d duplicates, %d lost (%d confirmed under faults, %d after)\n",
		rep.Seed, rep.Orders, rep.Executions, rep.Duplicates, rep.Lost, rep.ConfirmedUnderFaults, rep.ConfirmedAfter)
	fmt.Fprintf(&b, "attempts per order: mean %.2f, p50 %d, p99 %d, max %d; calls per order: mean %.2f, max %d\n",
		rep.AttemptsPerOrder.Mean, rep.AttemptsPerOrder.P50, rep.AttemptsPerOrder.P99, rep.AttemptsPerOrder.Max,
		rep.CallsPerOrder.Mean, rep.CallsPerOrder.Max)
	fmt.Fprintf(&b, "amplification %.3f (%d requests); duration p50 %v, p99 %v, max %v; phases %v under faults, %v settling\n",
		rep.Amplification, rep.Network.Requests, short(rep.Duration.P50), short(rep.Duration.P99),
		short(rep.Duration.Max), short(rep.UnderFaults), short(rep.Settling))
	n := rep.Network
	fmt.Fprintf(&b, "network: %d dropped, %d reset, %d delayed, %d held by a black hole\n", n.Dropped, n.Reset, n.Delayed, n.Blackholed)
	fmt.Fprintf(&b, "client saw: %s\n", counts(rep.ClientAnswers))
	fmt.Fprintf(&b, "server answered: %s\n", counts(rep.ServerAnswers))
	if len(rep.ServerLogged) > 0 {
		fmt.Fprintf(&b, "server logged: %s\n", counts(rep.ServerLogged))
	}
	for _, w := range rep.Windows {
		fmt.Fprintf(&b, "%v for %v", w.Fault, short(w.End.Sub(w.Start)))
		if w.Fault == StoreSlow {
			fmt.Fprintf(&b, " (latency %v)", w.Latency)
		}
		fmt.Fprintf(&b, ": %d requests, %d refused with 503, %d ran, %d other", w.Requests, w.Refused, w.Ran, w.Other)
		if w.Fault != Blackhole {
			fmt.Fprintf(&b, "; %d met the fault with every store call, %d of them not refused", w.Checked, w.Violations)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "audit: %d unanswered, %d mismatched", rep.AuditFailed, rep.AuditMismatched)
	return b.String()
}

// counts formats a count by name, largest first.
func counts(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s ×%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func spread(xs []int) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	sum := 0
	for _, x := range s {
		sum += x
	}
	return Spread{Mean: float64(sum) / float64(len(s)), P50: rank(s, 0.50), P99: rank(s, 0.99), Max: s[len(s)-1]}
}

func durationSpread(ds []time.Duration) DurationSpread {
	if len(ds) == 0 {
		return DurationSpread{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return DurationSpread{P50: rank(s, 0.50), P99: rank(s, 0.99), Max: s[len(s)-1]}
}

// rank returns the q-quantile of sorted by the nearest-rank method.
func rank[T any](sorted []T, q float64) T {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// short rounds d for reading: to 0.1ms below a second, to 1ms above.
func short(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
