package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/keyfield"
)

// envStore names the environment variable that gives the store's URL when
// -store is not set.
const envStore = "IDEMCTL_STORE"

// maxBody bounds a response body given to resolve: a record is read back
// whole on every replay.
const maxBody = 16 << 20

const usageText = `Usage:
  idemctl lookup  [flags] KEY
  idemctl resolve [flags] -status CODE [-body TEXT | -body-file FILE] [-header 'Name: value']... KEY
  idemctl forget  [flags] KEY

lookup prints the record of KEY; resolve records the request as done with the
given response, replayed to every retry; forget deletes the record, so that
the next request with KEY runs. The store is -store or $IDEMCTL_STORE: a
postgres:// or redis:// URL. A key whose holder's lease is live is settled
only with -force. Exit status: 0 done, 1 store failure, 2 usage error, 3 no
record for KEY, 4 refused: the lease is live.
`

// command is one parsed command line.
type command struct {
	name    string // lookup, resolve or forget
	id      engine.ID
	store   storeConfig
	timeout time.Duration
	json    bool
	force   bool // settle a key whose lease is live
	// resolve's response and TTL.
	resp *engine.Response
	ttl  time.Duration
}

// headerFlag collects -header values.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") || strings.ContainsAny(value, "\r\n") {
		return fmt.Errorf("%q is not 'Name: value'", v)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(textproto.CanonicalMIMEHeaderKey(name), strings.TrimSpace(value))
	return nil
}

func parseArgs(args []string, env environment) (*command, error) {
	if len(args) == 0 {
		fmt.Fprint(env.stdout, usageText)
		return nil, fmt.Errorf("%w: no command", errUsage)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		printHelp(env.stdout)
		return nil, flag.ErrHelp
	case "lookup", "resolve", "forget":
	default:
		return nil, fmt.Errorf("%w: unknown command %q: want lookup, resolve or forget", errUsage, args[0])
	}
	c := &command{name: args[0]}
	var ra resolveArgs
	fs := newFlagSet(c.name, c, &ra, env.stdout)
	// Flags may come after KEY too.
	var positional []string
	for rest := args[1:]; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		rest = rest[1:]
	}
	if len(positional) != 1 {
		return nil, fmt.Errorf("%w: %s takes one KEY, got %d arguments", errUsage, c.name, len(positional))
	}
	key, err := keyfield.Parse(positional[0])
	if err != nil {
		return nil, fmt.Errorf("%w: KEY %q: %v", errUsage, positional[0], err)
	}
	c.id.Key = key

	if c.store.url == "" {
		c.store.url = env.getenv(envStore)
	}
	if c.store.url == "" {
		return nil, fmt.Errorf("%w: no store: set -store or %s to a postgres:// or redis:// URL", errUsage, envStore)
	}
	if err := c.store.classify(); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if c.timeout <= 0 {
		return nil, fmt.Errorf("%w: -timeout %v is not positive", errUsage, c.timeout)
	}
	if c.name != "resolve" {
		return c, nil
	}

	var invalid []error
	if ra.status < 200 || ra.status > 599 {
		// An interim (1xx) status is no answer: net/http would answer
		// 200 to every retry instead.
		invalid = append(invalid, fmt.Errorf("-status %d: want a final status code, from 200 to 599", ra.status))
	}
	if c.ttl <= 0 {
		invalid = append(invalid, fmt.Errorf("-ttl %v is not positive", c.ttl))
	}
	if ra.body != "" && ra.bodyFile != "" {
		invalid = append(invalid, errors.New("-body and -body-file: give one"))
	}
	if _, ok := ra.headers.h[engine.HeaderOutcome]; ok {
		// A record with it is the "outcome unknown" answer again, to
		// this command's lookup and to every door that replays it.
		invalid = append(invalid, fmt.Errorf("-header %s: it marks the middleware's \"outcome unknown\" answer, which a resolved record is not", engine.HeaderOutcome))
	}
	if err := errors.Join(invalid...); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	b := []byte(ra.body)
	if ra.bodyFile != "" {
		if b, err = readBody(ra.bodyFile); err != nil {
			return nil, fmt.Errorf("%w: -body-file: %v", errUsage, err)
		}
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("%w: the body has %d bytes, more than %d", errUsage, len(b), maxBody)
	}
	c.resp = &engine.Response{Status: ra.status, Header: ra.headers.h, Body: b}
	return c, nil
}

// resolveArgs are the flags of resolve that describe the response.
type resolveArgs struct {
	status   int
	body     string
	bodyFile string
	headers  headerFlag
}

// newFlagSet returns the flags of the command name, stored in c and, for
// resolve, in ra.
func newFlagSet(name string, c *command, ra *resolveArgs, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("idemctl "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usageText)
		fmt.Fprintf(out, "\nFlags of %s:\n", name)
		fs.PrintDefaults()
	}
	commonFlags(fs, c)
	switch name {
	case "lookup":
		lookupFlags(fs, c)
	case "resolve":
		resolveFlags(fs, c, ra)
		settleFlags(fs, c)
	case "forget":
		settleFlags(fs, c)
	}
	return fs
}

// commonFlags are the flags of every command: the store and the key's
// scope.
func commonFlags(fs *flag.FlagSet, c *command) {
	fs.StringVar(&c.store.url, "store", "", "the store's `URL`: postgres://... or redis://... (default $"+envStore+")")
	fs.StringVar(&c.store.table, "table", "", "PostgreSQL: the records' `table`, [schema.]name (default pgstore's)")
	fs.StringVar(&c.store.prefix, "prefix", "", "Redis: the records' key `prefix` (default redisstore's)")
	fs.BoolVar(&c.store.cluster, "cluster", false, "Redis: the URL names a node of a Redis Cluster")
	fs.StringVar(&c.id.Scope, "scope", "", "the key's `scope`: what the middleware's scope function returned for the caller, as logged in its events")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "give up on the store after this long")
}

func lookupFlags(fs *flag.FlagSet, c *command) {
	fs.BoolVar(&c.json, "json", false, "print the record as JSON")
}

func resolveFlags(fs *flag.FlagSet, c *command, ra *resolveArgs) {
	fs.IntVar(&ra.status, "status", 0, "the `status` code of the response to record, a final one: 200 to 599 (required)")
	fs.StringVar(&ra.body, "body", "", "the response body, as `text`")
	fs.StringVar(&ra.bodyFile, "body-file", "", "read the response body from `file` (- for standard input)")
	fs.Var(&ra.headers, "header", "a response header, 'Name: value' (repeatable); not "+engine.HeaderOutcome+", which marks the middleware's own \"outcome unknown\" answer")
	fs.DurationVar(&c.ttl, "ttl", 24*time.Hour, "how long the record is kept, and replayed")
}

// settleFlags are the flags of the commands that change a record.
func settleFlags(fs *flag.FlagSet, c *command) {
	fs.BoolVar(&c.force, "force", false, "settle the key even while its holder's lease is live")
}

// printHelp writes the usage and the flags of every command, each once.
func printHelp(out io.Writer) {
	fmt.Fprint(out, usageText)
	var (
		c  command
		ra resolveArgs
	)
	for _, part := range []struct {
		heading string
		add     func(fs *flag.FlagSet)
	}{
		{"every command", func(fs *flag.FlagSet) { commonFlags(fs, &c) }},
		{"lookup", func(fs *flag.FlagSet) { lookupFlags(fs, &c) }},
		{"resolve", func(fs *flag.FlagSet) { resolveFlags(fs, &c, &ra) }},
		{"resolve and forget", func(fs *flag.FlagSet) { settleFlags(fs, &c) }},
	} {
		fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
		fs.SetOutput(out)
		part.add(fs)
		fmt.Fprintf(out, "\nFlags of %s:\n", part.heading)
		fs.PrintDefaults()
	}
}

func readBody(name string) ([]byte, error) {
	var r io.Reader
	if name == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return nil, err
	}
	return b, nil
}
