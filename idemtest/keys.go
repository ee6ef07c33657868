package idemtest

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// probe is a malformed key and what to call it in a report.
type probe struct {
	q    request
	name string // "the empty key"
}

// malformedProbes returns keys that the draft's syntax forbids but that an
// HTTP parser lets through to the application, each of a valid length in
// the target's key form, so that a target that takes keys of one length
// only judges them by what they contain: empty, with a tab, with a
// character outside the declared alphabet (none for AlphabetBytes, where
// only control characters are outside, and the tab stands for them), and a
// broken quoted string. With
// Target.MaxKeyLen, a key one byte too long joins them, and with
// Target.MinKeyLen, one a byte too short.
func (r *runner) malformedProbes() []probe {
	quoted := r.t.KeyForm == KeyQuoted
	form := func(inner string) string {
		if quoted {
			return `"` + inner + `"`
		}
		return inner
	}
	n := r.t.probeLen()
	k := randomHex(n)
	at := min(8, n-2) // where the bad character goes: inside the key
	tab := k[:at] + "\t" + k[at+1:]
	outside, outsideNote, outsideName := k[:at]+"é"+k[at+2:], " (é, in UTF-8)", "the key with a non-ASCII character"
	if r.t.KeyAlphabet == AlphabetUTF8 {
		outside, outsideNote, outsideName = k[:at]+"\xff"+k[at+1:], " (a byte that is not UTF-8)", "the key with a byte that is not UTF-8"
	}
	if len(outside) != n { // a 3-byte key has no room for é's two bytes
		outside = outside[:n]
	}
	unclosed := `"` + k[1:]
	unclosedText := " (no closing quote)"
	if quoted {
		// As long as a valid quoted key, with a character after the
		// closing quote.
		unclosed = `"` + k[:n-1] + `"x`
		unclosedText = " (a character after the closing quote)"
	}
	probes := []probe{
		r.probe("", "(empty)", "the empty key"),
		r.probe(form(tab), " (a tab)", "the key with a tab"),
	}
	if r.t.KeyAlphabet != AlphabetBytes {
		probes = append(probes, r.probe(form(outside), outsideNote, outsideName))
	}
	probes = append(probes, r.probe(unclosed, unclosedText, "the broken quoted string"))
	how := ""
	if quoted {
		how = ", between quotes"
	}
	if m := r.t.MaxKeyLen; m > 0 {
		long := randomHex(m + 1)
		p := r.probe(form(long), "", fmt.Sprintf("the %d-byte key", m+1))
		p.q.keyText = quote([]byte(long[:min(len(long), uuidKeyLen)])) + fmt.Sprintf("... (%d bytes, one over the limit of %d%s)", m+1, m, how)
		probes = append(probes, p)
	}
	if m := r.t.MinKeyLen; m > 1 {
		short := randomHex(m - 1)
		p := r.probe(form(short), fmt.Sprintf(" (%d bytes, one under the shortest of %d%s)", m-1, m, how), fmt.Sprintf("the %d-byte key", m-1))
		probes = append(probes, p)
	}
	return probes
}

// probe returns a probe whose key header is value, shown in reports as the
// value and then note (or as note alone when value is empty).
func (r *runner) probe(value, note, name string) probe {
	q := r.withValue(0, value)
	q.keyText = note
	if value != "" {
		q.keyText = quote([]byte(value)) + note
	}
	return probe{q, name}
}

func (r *runner) malformedKey() Result {
	want := "400 Bad Request for each"
	if r.t.KeysOptional {
		want += ", or, keys being optional, a request that runs as if it had no key (a second one with the same key runs again)"
	}
	var sent, got []string
	var bad, other, notes, unsure outcomes
	for _, p := range r.malformedProbes() {
		a := r.send(p.q)
		r.saw(checkMalformedKey, p.q, a)
		sent = append(sent, r.describe(p.q))
		line := r.describeAnswer(a)
		switch {
		case a.status == http.StatusBadRequest && a.err == nil && r.refusedValid(a):
			unsure.add("Refused with 400, as the requests with a valid key were too, so the refusal may not be for the key", p.name)
		case a.status == http.StatusBadRequest && a.err == nil:
		case a.ok() && r.marked(a):
			bad.add("Answered with a stored answer (marked as a replay), as if it were a key used before, not refused", p.name)
		case a.ok() && r.t.KeysOptional:
			// Ignored as a field that does not parse, or used as a key?
			b := r.send(p.q)
			r.saw(checkMalformedKey, p.q, b)
			line += "; then " + r.describeAnswer(b)
			switch {
			case r.marked(b) || b.same(a) && r.distinct == yes:
				bad.add("Used as a key (a second request with it got the first's answer)", p.name)
			case b.err == nil && (b.status == http.StatusConflict || b.status == http.StatusUnprocessableEntity):
				bad.add(fmt.Sprintf("Used as a key (a second request with it got %d instead of running)", b.status), p.name)
			case b.ok() && (!b.same(a) || r.marks == yes):
				notes.add("Ignored, as RFC 8941 allows of a field that does not parse (two requests with it both ran, as requests without a key do)", p.name)
			case b.ok():
				unsure.add("Accepted twice with equal answers, not marked as replays, from a target whose executions answer alike: the kit cannot tell whether it was ignored or used as a key", p.name)
			default:
				bad.add("Accepted, but a second request with it was not", p.name)
			}
		case a.ok():
			bad.add("Ran, not refused", p.name)
		case refused(a):
			other.add("Refused, but not with the 400 that a malformed request gets", fmt.Sprintf("%s (%d)", p.name, a.status))
		case a.err == nil && a.status >= 500:
			bad.add("Answered with a server error, which tells a client to retry a request that can never succeed",
				fmt.Sprintf("%s (%d)", p.name, a.status))
		default:
			bad.add("Not refused with 400", p.name)
		}
		got = append(got, line)
	}
	res := pass(strings.Join(sent, "\n"), strings.Join(got, "\n"), want, "")
	switch {
	case len(bad) > 0:
		res = fail(res.Sent, res.Got, want, append(bad, other...).String())
	case len(unsure) > 0:
		res = inconclusive(res.Sent, res.Got, want, append(unsure, other...).String())
	case len(other) > 0:
		res = advise(res.Sent, res.Got, want, other.String())
	}
	if len(notes) > 0 {
		res.Detail = strings.TrimSpace(res.Detail + " " + notes.String())
	}
	return res
}

// outcomes groups the probes of a check by what happened to them, in the
// order first seen.
type outcomes []outcome

type outcome struct {
	what  string
	names []string
}

func (o *outcomes) add(what, name string) {
	for i := range *o {
		if (*o)[i].what == what {
			(*o)[i].names = append((*o)[i].names, name)
			return
		}
	}
	*o = append(*o, outcome{what, []string{name}})
}

// String writes a sentence per outcome: "Ran, not refused: the empty key,
// the key with a tab."
func (o outcomes) String() string {
	sentences := make([]string, len(o))
	for i, c := range o {
		sentences[i] = c.what + ": " + strings.Join(c.names, ", ") + "."
	}
	return strings.Join(sentences, " ")
}

// byForm writes o, whose outcomes are the details of a check and whose
// names are forms of key, as the detail alone when all of n requests got
// it, and otherwise as a sentence per detail that names the forms: "With
// the 12-byte key: The repeat ..."
func (o outcomes) byForm(n int) string {
	if len(o) == 1 && len(o[0].names) == n {
		return o[0].what
	}
	sentences := make([]string, len(o))
	for i, c := range o {
		sentences[i] = "With " + strings.Join(slices.Compact(c.names), ", ") + ": " + c.what
	}
	return strings.Join(sentences, " ")
}

// withForm returns the request for variant with key written bare or
// quoted.
func (r *runner) withForm(variant int, key string, quoted bool) request {
	value := key
	if quoted {
		value = `"` + key + `"`
	}
	q := r.withValue(variant, value)
	q.key = key
	return q
}

func (r *runner) keyForms() Result {
	if r.t.KeyForm != KeyBoth {
		return notApplicable("The target is not declared to take keys both bare and quoted (Target.KeyForm KeyBoth, idemcheck -key-form both).")
	}
	const want = "the second form of each key gets the first form's answer, replayed"
	formName := map[bool]string{false: "bare", true: "quoted"}
	var sent, got, bad, unsure []string
	for _, quotedFirst := range []bool{false, true} {
		key := r.keyed(0).key
		first, second := r.withForm(0, key, quotedFirst), r.withForm(0, key, !quotedFirst)
		sent = append(sent, r.describe(first)+"; then "+r.describe(second))
		a := r.send(first)
		if !a.ok() {
			got = append(got, r.describeAnswer(a))
			bad = append(bad, fmt.Sprintf("the request with a %s key did not succeed (%s)", formName[quotedFirst], shortAnswer(a)))
			continue
		}
		b, conflicts := r.settle(second)
		r.saw(checkKeyForms, second, b)
		got = append(got, r.describeAnswer(a)+"; then "+conflictsThen(conflicts)+r.describeAnswer(b))
		what := fmt.Sprintf("the %s form after the %s one", formName[!quotedFirst], formName[quotedFirst])
		switch {
		case b.same(a) && (r.marked(b) || r.distinct == yes):
		case b.same(a):
			unsure = append(unsure, what+" got an equal answer, not marked as a replay")
		case b.ok():
			bad = append(bad, what+" ran the request again: the two forms are two keys")
		case b.err == nil && b.status == http.StatusBadRequest:
			bad = append(bad, what+" was refused with 400: the target does not take both forms")
		default:
			bad = append(bad, fmt.Sprintf("%s got %s, not the first's answer", what, shortAnswer(b)))
		}
	}
	res := pass(strings.Join(sent, "\n"), strings.Join(got, "\n"), want, "")
	switch {
	case len(bad) > 0:
		res = fail(res.Sent, res.Got, want, capitalize(strings.Join(bad, "; "))+".")
	case len(unsure) > 0:
		res = inconclusive(res.Sent, res.Got, want, capitalize(strings.Join(unsure, "; "))+
			": two executions under different keys answer equally too, so the kit cannot tell a replay from a second execution.")
	}
	return res
}

// shortAnswer names a's status, or the error that stood for an answer.
func shortAnswer(a answer) string {
	if a.status == 0 {
		return "no answer"
	}
	return strconv.Itoa(a.status)
}
