package main

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idempotency/engine"
)

// The states of a record, as lookup prints them.
const (
	stateInFlight       = "in flight"
	stateHolderLost     = "in flight, holder lost"
	stateCompleted      = "completed"
	stateOutcomeUnknown = "outcome unknown"
)

// maxShownBody bounds the body that lookup's text prints.
const maxShownBody = 2048

// stateOf says what became of the request, as far as its record tells.
func stateOf(r engine.Record) string {
	return stateAt(r, time.Time{})
}

// stateAt is stateOf, telling a holder whose lease ended at now apart.
func stateAt(r engine.Record, now time.Time) string {
	switch {
	case r.Completed && outcomeUnknown(r.Response):
		return stateOutcomeUnknown
	case r.Completed:
		return stateCompleted
	case !now.IsZero() && !r.LeaseEnds.After(now):
		return stateHolderLost
	}
	return stateInFlight
}

// outcomeUnknown reports whether resp is the middleware's final answer to a
// retry whose earlier holder was abandoned. Its header says so
// (engine.HeaderOutcome), whatever error writer wrote its body; a body of
// the problem type alone, without the header, is an answer of the
// service's own.
func outcomeUnknown(resp *engine.Response) bool {
	return resp.OutcomeUnknown()
}

// attempts is how many holders the record has had: the abandoned ones and
// the last.
func attempts(r engine.Record) int {
	if r.Abandoned == math.MaxInt {
		return r.Abandoned
	}
	return r.Abandoned + 1
}

// when prints t with how far it is from now.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now).Round(time.Second)
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + d.String()
	case d < 0:
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format(time.RFC3339) + " (" + rel + ")"
}

func writeText(w io.Writer, r engine.Record, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{name}, args...)...)
	}
	row("scope", "%s", printable(r.ID.Scope))
	row("key", "%s", printable(r.ID.Key))
	state := stateAt(r, now)
	switch state {
	case stateHolderLost:
		state += ": its lease ended and no retry has taken it over yet"
	case stateOutcomeUnknown:
		state += ": retries get a final 409 until it is resolved or expires"
	}
	row("state", "%s", state)
	row("attempts", "%d (%d abandoned: lost their lease without completing)", attempts(r), r.Abandoned)
	row("started", "%s", when(r.Created, now))
	if !r.Completed {
		row("lease ends", "%s", when(r.LeaseEnds, now))
	}
	row("expires", "%s", when(r.Expires, now))
	row("token", "%d", r.Token)
	row("fingerprint", "%s", hex.EncodeToString([]byte(r.Fingerprint)))
	for _, st := range sortedSteps(r.Steps) {
		if st.Done {
			row("step", "%s: done, %d result bytes", printable(st.Name), len(st.Result))
		} else {
			row("step", "%s: started, never finished (its effect may or may not have happened)", printable(st.Name))
		}
	}
	if resp := r.Response; resp != nil {
		row("response", "%d %s, %d body bytes%s", resp.Status, http.StatusText(resp.Status), len(resp.Body), omitted(resp))
		names := make([]string, 0, len(resp.Header))
		for name := range resp.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range resp.Header[name] {
				row("", "%s: %s", name, printable(v))
			}
		}
		if body, ok := showable(resp); ok {
			row("body", "%s", body)
		} else if len(resp.Body) > 0 {
			row("body", "not shown (binary or over %d bytes): use -json", maxShownBody)
		}
	}
	tw.Flush()
}

func omitted(resp *engine.Response) string {
	if resp.BodyOmitted {
		return " (body omitted: not stored)"
	}
	return ""
}

// showable returns the body as text, if it is short text.
func showable(resp *engine.Response) (string, bool) {
	if len(resp.Body) == 0 || len(resp.Body) > maxShownBody || !utf8.Valid(resp.Body) {
		return "", false
	}
	mt, _, _ := mime.ParseMediaType(http.Header(resp.Header).Get("Content-Type"))
	if mt != "" && !strings.HasPrefix(mt, "text/") && !strings.HasSuffix(mt, "json") && !strings.HasSuffix(mt, "xml") {
		return "", false
	}
	return printable(string(resp.Body)), true
}

// printable quotes s when it holds characters a terminal would act on.
func printable(s string) string {
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c == utf8.RuneError {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}

// jsonRecord is lookup's output with -json. Its state is one of in_flight,
// in_flight_holder_lost, completed and outcome_unknown.
type jsonRecord struct {
	Scope       string        `json:"scope"`
	Key         string        `json:"key"`
	State       string        `json:"state"`
	Attempts    int           `json:"attempts"`
	Abandoned   int           `json:"abandoned"`
	Created     time.Time     `json:"created"`
	LeaseEnds   *time.Time    `json:"lease_ends,omitempty"`
	Expires     time.Time     `json:"expires"`
	Token       int64         `json:"token"`
	Fingerprint string        `json:"fingerprint"`
	Steps       []jsonStep    `json:"steps,omitempty"`
	Response    *jsonResponse `json:"response,omitempty"`
}

// jsonStep is one of a record's steps (package step): done, or started and
// never finished.
type jsonStep struct {
	Name        string `json:"name"`
	Done        bool   `json:"done"`
	ResultBytes int    `json:"result_bytes"`
}

// sortedSteps returns steps by name.
func sortedSteps(steps []engine.Step) []engine.Step {
	steps = slices.Clone(steps)
	slices.SortFunc(steps, func(a, b engine.Step) int { return strings.Compare(a.Name, b.Name) })
	return steps
}

type jsonResponse struct {
	Status      int         `json:"status"`
	Header      http.Header `json:"header,omitempty"`
	Body        *string     `json:"body,omitempty"`
	BodyBase64  string      `json:"body_base64,omitempty"`
	BodyOmitted bool        `json:"body_omitted,omitempty"`
}

func writeJSON(w io.Writer, r engine.Record, now time.Time) error {
	out := jsonRecord{
		Scope:       r.ID.Scope,
		Key:         r.ID.Key,
		State:       strings.NewReplacer(", ", "_", " ", "_").Replace(stateAt(r, now)),
		Attempts:    attempts(r),
		Abandoned:   r.Abandoned,
		Created:     r.Created.UTC(),
		Expires:     r.Expires.UTC(),
		Token:       int64(r.Token),
		Fingerprint: hex.EncodeToString([]byte(r.Fingerprint)),
	}
	for _, st := range sortedSteps(r.Steps) {
		out.Steps = append(out.Steps, jsonStep{Name: st.Name, Done: st.Done, ResultBytes: len(st.Result)})
	}
	if !r.Completed {
		t := r.LeaseEnds.UTC()
		out.LeaseEnds = &t
	}
	if resp := r.Response; resp != nil {
		jr := &jsonResponse{Status: resp.Status, Header: resp.Header, BodyOmitted: resp.BodyOmitted}
		if utf8.Valid(resp.Body) {
			body := string(resp.Body)
			jr.Body = &body
		} else {
			jr.BodyBase64 = base64.StdEncoding.EncodeToString(resp.Body)
		}
		out.Response = jr
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
