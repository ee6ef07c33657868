// Command idemcheck checks that an HTTP endpoint, written in any language,
// honours the Idempotency-Key protocol: a retried request is answered from a
// record of the first instead of running twice. It runs the checks of package
// idemtest against a live URL.
//
// Usage:
//
//	idemcheck [flags] URL
//
// For example:
//
//	idemcheck -H 'Authorization: Bearer test-alice' -H2 'Authorization: Bearer test-bob' \
//		-fail-header 'X-Test-Fail: 1' -d '{"sku":"A1","note":"{{variant}}"}' \
//		https://staging.example.com/orders
//
// It prints a table of the checks, the details of each failure, and a
// summary line, or the report as JSON with -json. The exit status is 0 when
// no check fails, 1 when one fails, 2 for a usage error, and 3 when the
// endpoint's host cannot be reached. Run idemcheck -h for the flags and a
// description of each check.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/idemkit/idempotency/idemtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitUnreachable = 3
)

// run is the whole command but for the process: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseArgs(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemcheck: %v\nRun 'idemcheck -h' for usage.\n", err)
		return exitUsage
	}
	if c := opts.target.Client; c != nil {
		defer c.CloseIdleConnections()
	}
	report, err := idemtest.Check(ctx, opts.target)
	if errors.Is(err, idemtest.ErrUnreachable) {
		fmt.Fprintf(stderr, "idemcheck: %v\n", err)
		return exitUnreachable
	}
	if report == nil {
		fmt.Fprintf(stderr, "idemcheck: %v\n", err)
		return exitUsage
	}
	if opts.json {
		werr := writeJSON(stdout, report)
		if werr != nil {
			fmt.Fprintf(stderr, "idemcheck: %v\n", werr)
		}
	} else {
		writeTable(stdout, report)
	}
	if err != nil { // interrupted: the report is partial
		fmt.Fprintf(stderr, "idemcheck: %v\n", err)
		return exitFailed
	}
	if report.Err() != nil {
		return exitFailed
	}
	return exitOK
}

// jsonReport is the document -json writes.
type jsonReport struct {
	*idemtest.Report
	Summary summary `json:"summary"`
	// OK is true when no check failed: the exit status is 0.
	OK bool `json:"ok"`
}

// summary counts the results of a report by status.
type summary struct {
	Passed        int `json:"passed"`
	Failed        int `json:"failed"`
	NotApplicable int `json:"not_applicable"`
	Advisory      int `json:"advisory"`
	Inconclusive  int `json:"inconclusive"`
}

// summarize counts r's results by status.
func summarize(r *idemtest.Report) summary {
	var s summary
	for _, res := range r.Results {
		switch res.Status {
		case idemtest.StatusPass:
			s.Passed++
		case idemtest.StatusFail:
			s.Failed++
		case idemtest.StatusNotApplicable:
			s.NotApplicable++
		case idemtest.StatusAdvisory:
			s.Advisory++
		case idemtest.StatusInconclusive:
			s.Inconclusive++
		}
	}
	return s
}

func writeJSON(w io.Writer, r *idemtest.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(jsonReport{Report: r, Summary: summarize(r), OK: r.Err() == nil})
}

// label is how the table shows a status: failures stand out.
func label(s idemtest.Status) string {
	switch s {
	case idemtest.StatusFail:
		return "FAIL"
	case idemtest.StatusNotApplicable:
		return "n/a"
	}
	return string(s)
}

// tableWidth is the width the table's notes are wrapped to.
const tableWidth = 100

func writeTable(w io.Writer, r *idemtest.Report) {
	fmt.Fprintf(w, "Checked %s\n\n", r.Target)
	nameWidth, labelWidth := len("CHECK"), len("RESULT")
	for _, res := range r.Results {
		nameWidth = max(nameWidth, len(res.Name))
		labelWidth = max(labelWidth, len(label(res.Status)))
	}
	indent := nameWidth + 2 + labelWidth + 2
	noteWidth := max(tableWidth-indent, 40)
	fmt.Fprintf(w, "%-*s  %-*s  NOTE\n", nameWidth, "CHECK", labelWidth, "RESULT")
	for _, res := range r.Results {
		lines := wrap(res.Detail, noteWidth)
		first := ""
		if len(lines) > 0 {
			first = lines[0]
		}
		// An empty note leaves no padding behind.
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("%-*s  %-*s  %s", nameWidth, res.Name, labelWidth, label(res.Status), first), " "))
		for _, line := range lines[min(1, len(lines)):] {
			fmt.Fprintf(w, "%*s%s\n", indent, "", line)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, note := range r.Notes {
			for i, line := range wrap(note, tableWidth-2) {
				prefix := "  "
				if i == 0 {
					prefix = "* "
				}
				fmt.Fprintln(w, prefix+line)
			}
		}
	}
	fmt.Fprintf(w, "\nPolicy: %s.\n", r.Policy)
	for _, res := range r.Results {
		switch res.Status {
		case idemtest.StatusFail, idemtest.StatusAdvisory, idemtest.StatusInconclusive:
		default:
			continue
		}
		fmt.Fprintf(w, "\n--- %s %s: %s\n", label(res.Status), res.Name, res.Detail)
		for _, part := range [...]struct{ label, text string }{{"sent", res.Sent}, {"got ", res.Got}, {"want", res.Want}} {
			if part.text != "" {
				fmt.Fprintf(w, "    %s: %s\n", part.label, strings.ReplaceAll(part.text, "\n", "\n          "))
			}
		}
	}
	fmt.Fprintf(w, "\n%s\n", r.Summary())
}
