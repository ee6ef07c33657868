package idemtest

import (
	"errors"
	"strconv"
	"strings"
)

// Status is the outcome of one check.
type Status string

// The outcomes of a check.
const (
	// StatusPass: the target did what the protocol expects.
	StatusPass Status = "pass"
	// StatusFail: the target broke a requirement of the protocol.
	StatusFail Status = "fail"
	// StatusNotApplicable: the check could not be run against this target;
	// Result.Detail says why.
	StatusNotApplicable Status = "not-applicable"
	// StatusAdvisory: the target does not follow a recommendation, or a
	// policy that the Target does not require. It does not make Report.Err
	// fail.
	StatusAdvisory Status = "advisory"
	// StatusInconclusive: the check ran, but what it saw does not show
	// whether the target meets the requirement, such as concurrent
	// requests that never overlapped; Result.Detail says what to change to
	// make the check tell. It does not make Report.Err fail.
	StatusInconclusive Status = "inconclusive"
)

// Result is the outcome of one check, with the evidence for it.
type Result struct {
	// Name is the check's name, one of those Checks returns.
	Name string `json:"name"`
	// Status is the outcome.
	Status Status `json:"status"`
	// Sent describes the requests the check sent: method, path, key,
	// the names of the headers and the body.
	Sent string `json:"sent,omitempty"`
	// Got describes the answers that came back.
	Got string `json:"got,omitempty"`
	// Want says what the protocol expects.
	Want string `json:"want,omitempty"`
	// Detail explains the outcome: what went wrong, why the check does not
	// apply, or what the kit could not tell from outside.
	Detail string `json:"detail,omitempty"`
}

// Report is what Check found: one Result per check run, in the order of
// Checks.
type Report struct {
	// Target is the URL of the endpoint checked.
	Target string `json:"target"`
	// Policy is what the target was judged by where the draft leaves the
	// choice to the server.
	Policy Policy `json:"policy"`
	// Results holds one Result per check run.
	Results []Result `json:"results"`
	// Notes are what the kit noticed about the target as a whole: that
	// replays are marked with a header of another name than
	// Target.ReplayedHeader, or that every request ran as if it had no key.
	Notes []string `json:"notes,omitempty"`
}

// Policy is what Check judged a target by where the draft leaves the choice
// to the server: the Target's declarations, as Check applied them.
type Policy struct {
	// KeysOptional: requests without a key may run (Target.KeysOptional).
	KeysOptional bool `json:"keys_optional"`
	// KeyForm is how the keys were written (Target.KeyForm).
	KeyForm KeyForm `json:"key_form"`
	// MaxKeyLen is the key length limit that was probed, 0 for none
	// (Target.MaxKeyLen).
	MaxKeyLen int `json:"max_key_len"`
	// MinKeyLen is the shortest key length declared, 0 for none
	// (Target.MinKeyLen).
	MinKeyLen int `json:"min_key_len,omitempty"`
	// KeyAlphabet is the alphabet the keys were judged by
	// (Target.KeyAlphabet).
	KeyAlphabet KeyAlphabet `json:"key_alphabet,omitempty"`
	// Release5xx is true when a retry after a 5xx had to run again, and
	// false when a stored 5xx was only advisory
	// (Target.Require5xxRelease).
	Release5xx bool `json:"release_5xx_required"`
}

// String describes the policy in a line, such as "keys required, sent bare;
// no key length limit probed; release after 5xx advisory".
func (p Policy) String() string {
	keys := "keys required"
	if p.KeysOptional {
		keys = "keys optional"
	}
	form := map[KeyForm]string{KeyBare: "sent bare", KeyQuoted: "sent quoted", KeyBoth: "sent bare and quoted"}[p.KeyForm]
	if form == "" {
		form = "sent " + string(p.KeyForm)
	}
	limit := describeKeyLimits(Target{MinKeyLen: p.MinKeyLen, MaxKeyLen: p.MaxKeyLen, KeyAlphabet: p.KeyAlphabet})
	if p.MaxKeyLen == 0 && p.MinKeyLen == 0 {
		if limit == "" {
			limit = "no key length limit probed"
		} else {
			limit = "no key length limit probed, " + limit
		}
	}
	release := "release after 5xx advisory"
	if p.Release5xx {
		release = "release after 5xx required"
	}
	return keys + ", " + form + "; " + limit + "; " + release
}

// Result returns the result of the named check, if it ran.
func (r *Report) Result(name string) (Result, bool) {
	for _, res := range r.Results {
		if res.Name == name {
			return res, true
		}
	}
	return Result{}, false
}

// Failed returns the results of the checks that failed.
func (r *Report) Failed() []Result {
	var failed []Result
	for _, res := range r.Results {
		if res.Status == StatusFail {
			failed = append(failed, res)
		}
	}
	return failed
}

// Err returns nil when no check failed (advisories, inconclusive checks and
// checks that do not apply are not failures), and otherwise an error that lists every failed
// check with what was sent, what came back and what was expected, in the
// manner of testing/fstest.TestFS.
func (r *Report) Err() error {
	failed := r.Failed()
	if len(failed) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString("idemtest: ")
	if len(failed) == 1 {
		b.WriteString("1 check failed:")
	} else {
		b.WriteString(strconv.Itoa(len(failed)) + " checks failed:")
	}
	for _, res := range failed {
		b.WriteString("\n" + res.Name + ": " + res.Detail)
		for _, line := range [...]struct{ label, text string }{{"sent", res.Sent}, {"got", res.Got}, {"want", res.Want}} {
			if line.text != "" {
				b.WriteString("\n\t" + line.label + ": " + strings.ReplaceAll(line.text, "\n", "\n\t\t"))
			}
		}
	}
	return errors.New(b.String())
}

// Summary returns a line that counts the report's results by status, such
// as "7 passed, 1 failed, 2 not applicable": the passed and failed counts
// always appear, the others when not zero.
func (r *Report) Summary() string {
	var passed, failed, notApplicable, advisory, inconclusive int
	for _, res := range r.Results {
		switch res.Status {
		case StatusPass:
			passed++
		case StatusFail:
			failed++
		case StatusNotApplicable:
			notApplicable++
		case StatusAdvisory:
			advisory++
		case StatusInconclusive:
			inconclusive++
		}
	}
	out := strconv.Itoa(passed) + " passed, " + strconv.Itoa(failed) + " failed"
	if notApplicable > 0 {
		out += ", " + strconv.Itoa(notApplicable) + " not applicable"
	}
	if advisory > 0 {
		out += ", " + strconv.Itoa(advisory) + " advisory"
	}
	if inconclusive > 0 {
		out += ", " + strconv.Itoa(inconclusive) + " inconclusive"
	}
	return out
}
