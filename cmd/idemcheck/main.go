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
// every required check passes, 1 when one fails, and 2 for a usage error.
// Run idemcheck -h for the flags and a description of each check.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"

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
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
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
	Summary idemtest.Summary `json:"summary"`
	// OK is true when no check failed: the exit status is 0.
	OK bool `json:"ok"`
}

func writeJSON(w io.Writer, r *idemtest.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(jsonReport{Report: r, Summary: r.Summary(), OK: r.Err() == nil})
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

func writeTable(w io.Writer, r *idemtest.Report) {
	fmt.Fprintf(w, "Checked %s\n\n", r.Target)
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tNOTE")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.Name, label(res.Status), firstSentence(res.Detail, 80))
	}
	tw.Flush()
	for line := range strings.Lines(table.String()) {
		// An empty note leaves the padding of the column before it.
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	for _, res := range r.Results {
		if res.Status != idemtest.StatusFail && res.Status != idemtest.StatusAdvisory {
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

// firstSentence returns the first sentence of s, cut to at most n bytes.
func firstSentence(s string, n int) string {
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if len(s) > n {
		s = s[:n-3] + "..."
	}
	return s
}
