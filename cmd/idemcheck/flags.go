package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idempotency/idemtest"
)

// options is what the command line asks for.
type options struct {
	target idemtest.Target
	json   bool
}

// headerFlag collects repeated "Name: value" flags into a header.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("%q is not a header: want 'Name: value'", s)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

// parseArgs turns the command line into options. It returns flag.ErrHelp,
// having written the help to stdout, when asked for it.
func parseArgs(args []string, stdout io.Writer) (options, error) {
	fs := flag.NewFlagSet("idemcheck", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by the caller
	fs.Usage = func() {}
	var (
		header, second, failHeader headerFlag

		rawURL       = fs.String("url", "", "the endpoint `URL`, if not given as the argument")
		method       = fs.String("X", http.MethodPost, "the request `method`")
		body         = fs.String("d", "", "the request `body`, or @file to read it from a file; each {{variant}} in it is replaced by the variant number")
		concurrency  = fs.Int("n", 10, "how many identical requests the concurrent check sends at once")
		keyHeader    = fs.String("key-header", "Idempotency-Key", "the request header that carries the key")
		replayHeader = fs.String("replay-header", "Idempotent-Replayed", "the response header that marks a replay")
		keysOptional = fs.Bool("keys-optional", false, "the endpoint runs requests without a key (the missing-key check does not apply, and a malformed key may be ignored)")
		keyForm      = fs.String("key-form", string(idemtest.KeyBare), "the key `form`: bare, quoted (an RFC 8941 string, as the draft defines keys), or both (keys sent bare, and the key-forms check)")
		maxKeyLen    = fs.Int("max-key-len", 0, "the longest key the endpoint accepts, in `bytes`: a key one byte longer must be refused (default: no limit probed, the draft sets none)")
		minKeyLen    = fs.Int("min-key-len", 0, "the shortest key the endpoint accepts, in `bytes`: a key one byte shorter must be refused, and the valid keys sent (12, 36, 64 and 255 bytes, a stripe-go style key) are those within -min-key-len and -max-key-len; both 36 for an endpoint that takes only UUIDs")
		keyAlphabet  = fs.String("key-alphabet", string(idemtest.AlphabetASCII), "the characters the endpoint documents for keys: ascii (printable ASCII, the draft's), utf8 (UTF-8 text: a non-ASCII key is then valid, and a byte that is not UTF-8 malformed) or bytes (any byte but control characters: keys with non-ASCII characters and with bytes that are not UTF-8 are then valid)")
		release5xx   = fs.Bool("require-5xx-release", false, "require policy release-5xx: a retry after a 5xx runs again (default: a stored 5xx is advisory, as the draft allows it)")
		timeout      = fs.Duration("timeout", 10*time.Second, "the longest each request may take")
		patience     = fs.Duration("patience", 10*time.Second, "how long to keep retrying while the endpoint answers 409 (in flight)")
		dropAfter    = fs.Duration("drop-after", 100*time.Millisecond, "when the dropped-response check closes its connection")
		only         = fs.String("checks", "", "a comma-separated `list` of the checks to run (default all)")
		insecure     = fs.Bool("insecure", false, "do not verify the server's TLS certificate")
		asJSON       = fs.Bool("json", false, "write the report as JSON")
	)
	fs.Var(&header, "H", "a request `header` ('Name: value'), repeatable: credentials, Content-Type (default application/json)")
	fs.Var(&second, "H2", "a `header` ('Name: value') of a second caller, replacing the -H header of that name; repeatable; enables the cross-tenant check")
	fs.Var(&failHeader, "fail-header", "a `header` ('Name: value') that makes the endpoint answer 5xx, repeatable; enables the 5xx-not-cached check")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout, fs)
		}
		return options{}, err
	}
	switch {
	case fs.NArg() > 1:
		return options{}, fmt.Errorf("one URL, please: got %q", fs.Args())
	case fs.NArg() == 1 && *rawURL != "":
		return options{}, errors.New("the URL is given twice, as -url and as the argument")
	case fs.NArg() == 1:
		*rawURL = fs.Arg(0)
	case *rawURL == "":
		return options{}, errors.New("no URL to check")
	}

	t := idemtest.Target{
		URL:               *rawURL,
		Method:            *method,
		Header:            header.h,
		SecondCredential:  second.h,
		FailHeader:        failHeader.h,
		KeysOptional:      *keysOptional,
		KeyForm:           idemtest.KeyForm(*keyForm),
		MaxKeyLen:         *maxKeyLen,
		MinKeyLen:         *minKeyLen,
		KeyAlphabet:       idemtest.KeyAlphabet(*keyAlphabet),
		Require5xxRelease: *release5xx,
		KeyHeader:         *keyHeader,
		ReplayedHeader:    *replayHeader,
		Concurrency:       *concurrency,
		Timeout:           *timeout,
		Patience:          *patience,
		DropAfter:         *dropAfter,
	}
	if t.Header == nil {
		t.Header = http.Header{}
	}
	if t.Header.Get("Content-Type") == "" {
		t.Header.Set("Content-Type", "application/json")
	}
	if *body != "" {
		tmpl := *body
		if file, ok := strings.CutPrefix(tmpl, "@"); ok {
			b, err := os.ReadFile(file)
			if err != nil {
				return options{}, fmt.Errorf("-d: %w", err)
			}
			tmpl = string(b)
		}
		t.Body = idemtest.BodyTemplate(tmpl)
	}
	if *only != "" {
		for name := range strings.SplitSeq(*only, ",") {
			if name = strings.TrimSpace(name); name != "" {
				t.Checks = append(t.Checks, name)
			}
		}
	}
	if *insecure {
		t.Client = &http.Client{
			Transport: &http.Transport{
				Proxy:           http.ProxyFromEnvironment,
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return options{target: t, json: *asJSON}, nil
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Usage: idemcheck [flags] URL

idemcheck checks that the endpoint at URL honours the Idempotency-Key
protocol: that a retried request is answered from a record of the first
instead of running twice. It speaks only HTTP, so the endpoint may be written
in any language. Each check sends requests with fresh keys of its own and
creates what the endpoint creates (about one resource per check): point it at
a test or staging deployment.

Every check sends the same request: the method, the -H headers and the -d
body. The key-mismatch check also sends a different body under a key already
used: each {{variant}} in the body is replaced by 0 for the usual
request and by 1 for the different one. A body without the placeholder gets a
trailing space instead, which a server that fingerprints parsed JSON does not
see as a different request: give it a placeholder. Without -d, the body is
{"idemtest_variant":0}. The requests of the concurrent and dropped-response
checks are written on raw connections to the URL's host, not through a
proxy.

Where the draft leaves a choice to the server, the endpoint is judged by the
policy that the flags declare, and the report says which: -keys-optional,
-key-form, -max-key-len, -min-key-len, -key-alphabet and -require-5xx-release.
The checks that need a valid key send keys of several lengths and forms, so
an endpoint that takes keys of one length only must declare it.

The concurrent check passes only when it has seen a duplicate reach the
endpoint's idempotency layer while the first request ran there: a 409, or
duplicates that waited as long as the first took to run, while a request
under another key sent with them ran alongside it. It times runs and a
replay alone first. A 100 Continue shows nothing: servers send it before
the application sees the key. Against an endpoint that runs a request in
less than 50ms more than it takes to replay one, duplicates released
together come after the first has finished, and the check is inconclusive:
point it at an endpoint that takes 100ms or more (a test endpoint whose
handler sleeps, say 250ms). Against a server that handles one request at a
time, it is inconclusive too.

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprint(w, "\nChecks, in the order they run:\n")
	for _, c := range idemtest.Checks() {
		desc := c.Description
		if c.Advisory {
			desc = "(advisory: reported, not failed) " + desc
		}
		fmt.Fprintf(w, "  %s\n", c.Name)
		for _, line := range wrap(desc, 72) {
			fmt.Fprintf(w, "      %s\n", line)
		}
	}
	fmt.Fprint(w, `
Output: a table of the checks, the notes on the endpoint, the policy it was
judged by, the details of each failure, advisory and inconclusive check, and
a summary line; with -json, the report as a JSON document.

Exit status: 0 when no check fails (advisory and inconclusive checks do not
fail), 1 when a check fails, 2 for a usage error, 3 when the endpoint's host
cannot be reached.
`)
}

// wrap breaks s into lines of at most width bytes, at spaces.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
