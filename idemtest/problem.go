package idemtest

import (
	"encoding/json"
	"fmt"
	"mime"
	"strings"
)

func (r *runner) problemJSON() Result {
	if len(r.problems) == 0 {
		return notApplicable("No 400, 409 or 422 answer was seen: the checks that provoke them did not run or got other answers.")
	}
	const want = `Content-Type: application/problem+json, and a JSON object with "type" and "title" strings and a "status" equal to the answer's`
	var sent, got, bad []string
	for _, s := range r.problems {
		sent = append(sent, s.check+": "+r.describe(s.q))
		got = append(got, s.check+": "+r.describeAnswer(s.a))
		if why := problemFault(s.a); why != "" {
			bad = append(bad, fmt.Sprintf("the %d answer seen by %s %s", s.a.status, s.check, why))
		}
	}
	res := pass(strings.Join(sent, "\n"), strings.Join(got, "\n"), want, "")
	if len(bad) > 0 {
		res = fail(res.Sent, res.Got, want, capitalize(strings.Join(bad, "; "))+".")
	}
	return res
}

// problemFault says how a falls short of an RFC 9457 problem document, or
// returns "" if it does not.
func problemFault(a answer) string {
	mt, _, err := mime.ParseMediaType(a.header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		return "is not application/problem+json"
	}
	var doc map[string]any
	if err := json.Unmarshal(a.body, &doc); err != nil {
		return "is not a JSON object"
	}
	var missing []string
	for _, member := range []string{"type", "title"} {
		if s, ok := doc[member].(string); !ok || s == "" {
			missing = append(missing, `"`+member+`"`)
		}
	}
	if len(missing) > 0 {
		return "has no " + strings.Join(missing, " or ")
	}
	status, ok := doc["status"].(float64)
	if !ok {
		return `has no "status"`
	}
	if int(status) != a.status {
		return fmt.Sprintf(`has "status" %v`, status)
	}
	return ""
}
