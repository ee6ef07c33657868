// Command table writes the compatibility table of the kit's README from the
// reports of a run of ../run.sh: a column per implementation, a row
// per check, and below it what each implementation was seen to do. With
// -readme, it replaces the text between the README's compat markers
// instead of writing to standard output.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemkit/idempotency/idemtest"
)

// meta describes one implementation's run, as run.sh writes it.
type meta struct {
	Name      string `json:"name"`      // the implementation: its package
	Version   string `json:"version"`   // the package's version
	Framework string `json:"framework"` // what it runs in, with version
	Flags     string `json:"flags"`     // the flags idemcheck was given
	Fail      string `json:"fail"`      // how the endpoint answers 5xx
}

// run is what one implementation's runs gave.
type run struct {
	meta
	main, keyForms, fast, respond *idemtest.Report
}

const (
	begin = "<!-- compat:begin -->"
	end   = "<!-- compat:end -->"
)

func main() {
	readme := flag.String("readme", "", "the README `file` whose compat section to replace")
	header := flag.String("header", "", "a `line` to write before the table")
	flag.Parse()
	if flag.NArg() != 1 {
		log.Fatal("usage: table [-readme file] [-header line] results-dir")
	}
	runs, err := load(flag.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	var b bytes.Buffer
	if *header != "" {
		fmt.Fprintf(&b, "%s\n\n", *header)
	}
	write(&b, runs)
	if *readme == "" {
		os.Stdout.Write(b.Bytes())
		return
	}
	if err := replace(*readme, b.Bytes()); err != nil {
		log.Fatal(err)
	}
}

// load reads the runs named, in order, in dir/runs.txt.
func load(dir string) ([]run, error) {
	list, err := os.ReadFile(filepath.Join(dir, "runs.txt"))
	if err != nil {
		return nil, err
	}
	var runs []run
	for _, name := range strings.Fields(string(list)) {
		var r run
		if err := readJSON(filepath.Join(dir, name+".meta.json"), &r.meta); err != nil {
			return nil, err
		}
		for suffix, report := range map[string]**idemtest.Report{
			"": &r.main, ".keyforms": &r.keyForms, ".fast": &r.fast, ".respond": &r.respond,
		} {
			var rep idemtest.Report
			err := readJSON(filepath.Join(dir, name+suffix+".json"), &rep)
			switch {
			case errors.Is(err, os.ErrNotExist) && suffix != "":
			case err != nil:
				return nil, err
			default:
				*report = &rep
			}
		}
		runs = append(runs, r)
	}
	return runs, nil
}

func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// status is a result as a table cell: failures stand out.
func status(r *idemtest.Report, check string) string {
	if r == nil {
		return "—"
	}
	res, ok := r.Result(check)
	if !ok {
		return "—"
	}
	switch res.Status {
	case idemtest.StatusFail:
		return "**FAIL**"
	case idemtest.StatusNotApplicable:
		return "n/a"
	}
	return string(res.Status)
}

func write(w io.Writer, runs []run) {
	row := func(label string, cell func(r run) string) {
		cells := []string{label}
		for _, r := range runs {
			cells = append(cells, strings.ReplaceAll(cell(r), "|", `\|`))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	row("", func(r run) string { return "**" + r.Name + "**" })
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(runs)+1))
	row("version", func(r run) string { return r.Version })
	row("runs in", func(r run) string { return r.Framework })
	row("flags", func(r run) string { return "`" + r.Flags + "`" })
	row("policy", func(r run) string { return r.main.Policy.String() })
	row("a 5xx is", func(r run) string { return r.Fail })
	for _, c := range idemtest.Checks() {
		row("`"+c.Name+"`", func(r run) string { return status(r.main, c.Name) })
	}
	row("`key-forms` with `-key-form both`", func(r run) string {
		if r.keyForms == nil {
			return "not claimed" // no promise of quoted keys to judge
		}
		return status(r.keyForms, "key-forms")
	})
	row("`concurrent`, handler without delay", func(r run) string { return status(r.fast, "concurrent") })
	row("`5xx-not-cached`, handler answers 500 itself", func(r run) string { return status(r.respond, "5xx-not-cached") })

	for _, r := range runs {
		fmt.Fprintf(w, "\n**%s %s**", r.Name, r.Version)
		if r.Framework != "" {
			fmt.Fprintf(w, " (%s)", r.Framework)
		}
		fmt.Fprintf(w, ": %s\n\n", r.main.Summary())
		for _, note := range r.main.Notes {
			fmt.Fprintf(w, "- %s\n", note)
		}
		seen := func(label string, rep *idemtest.Report, only string) {
			if rep == nil {
				return
			}
			for _, res := range rep.Results {
				if only != "" && res.Name != only {
					continue
				}
				switch res.Status {
				case idemtest.StatusFail, idemtest.StatusAdvisory, idemtest.StatusInconclusive:
					fmt.Fprintf(w, "- `%s`%s, %s: %s\n", res.Name, label, res.Status, res.Detail)
				}
			}
		}
		seen("", r.main, "")
		seen(" with `-key-form both`", r.keyForms, "key-forms")
		seen(" with a handler without delay", r.fast, "concurrent")
		seen(" with a handler that answers 500 itself", r.respond, "5xx-not-cached")
	}
}

// replace writes text between the markers of the README file.
func replace(file string, text []byte) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	i, j := bytes.Index(b, []byte(begin)), bytes.Index(b, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s section", file, begin, end)
	}
	var out bytes.Buffer
	out.Write(b[:i+len(begin)])
	out.WriteString("\n")
	out.Write(text)
	out.Write(b[j:])
	return os.WriteFile(file, out.Bytes(), 0o644)
}
