package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/wire"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a memstore that the command opens instead of a database, and
// the command's output.
type fixture struct {
	store  memstore.Store
	opened []storeConfig
	stdout bytes.Buffer
	stderr bytes.Buffer
	now    time.Time
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	s, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return &fixture{store: s, now: time.Now()}
}

// run runs the command with args; the store's URL comes from the
// environment unless args give one.
func (f *fixture) run(args ...string) int {
	f.stdout.Reset()
	f.stderr.Reset()
	return run(context.Background(), args, environment{
		stdout: &f.stdout,
		stderr: &f.stderr,
		getenv: func(name string) string {
			if name == envStore {
				return "postgres://operator:s3cret@db.internal:5432/orders"
			}
			return ""
		},
		open: func(_ context.Context, c storeConfig) (engine.Store, func(), error) {
			f.opened = append(f.opened, c)
			return f.store, func() {}, nil
		},
		now: func() time.Time { return f.now },
	})
}

var (
	ctx   = context.Background()
	scope = "auth:0123456789abcdef"
)

func id(key string) engine.ID { return engine.ID{Scope: scope, Key: key} }

// claim acquires key in the store, as a request would.
func (f *fixture) claim(t *testing.T, key string, lease time.Duration) engine.Claim {
	t.Helper()
	c, err := f.store.Claim(ctx, id(key), "fingerprint", lease, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	return c
}

// takeOver claims key until the expired lease is taken over.
func (f *fixture) takeOver(t *testing.T, key string) engine.Claim {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := f.store.Claim(ctx, id(key), "fingerprint", time.Minute, time.Hour)
		require.NoError(t, err)
		if c.Status == engine.Acquired {
			return c
		}
		require.False(t, time.Now().After(deadline), "lease of %s not expired after 10s", key)
	}
}

// outcomeUnknownProblem is the record of the middleware's "outcome unknown"
// answer, as its default error writer makes it.
func outcomeUnknownProblem() *engine.Response {
	return &engine.Response{
		Status: http.StatusConflict,
		Header: http.Header{"Content-Type": {"application/problem+json"}, engine.HeaderOutcome: {"unknown"}},
		Body:   []byte(`{"type":"` + wire.TypeOutcomeUnknown + `","title":"Outcome unknown","status":409,"code":"` + wire.CodeOutcomeUnknown + `"}`),
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, f *fixture)
		want  []string
	}{
		{
			name:  "in flight",
			setup: func(t *testing.T, f *fixture) { f.claim(t, "order-1", time.Minute) },
			want:  []string{"state        in flight\n", "attempts     1 (0 abandoned", "lease ends   ", "(in 1m0s)"},
		},
		{
			name: "holder lost",
			setup: func(t *testing.T, f *fixture) {
				f.claim(t, "order-1", time.Millisecond)
				f.now = f.now.Add(time.Minute)
			},
			want: []string{"state        in flight, holder lost: its lease ended and no retry has taken it over yet\n"},
		},
		{
			name: "taken over",
			setup: func(t *testing.T, f *fixture) {
				f.claim(t, "order-1", time.Millisecond)
				f.takeOver(t, "order-1")
			},
			want: []string{"state        in flight\n", "attempts     2 (1 abandoned"},
		},
		{
			name: "completed",
			setup: func(t *testing.T, f *fixture) {
				c := f.claim(t, "order-1", time.Minute)
				resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}}, Body: []byte(`{"order":1}`)}
				require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, resp, time.Hour))
			},
			want: []string{"state        completed\n", "response     201 Created, 11 body bytes\n", "             Location: /orders/1\n", "body         {\"order\":1}\n"},
		},
		{
			name: "outcome unknown",
			setup: func(t *testing.T, f *fixture) {
				f.claim(t, "order-1", time.Millisecond)
				c := f.takeOver(t, "order-1")
				require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, outcomeUnknownProblem(), time.Hour))
			},
			want: []string{"state        outcome unknown: retries get a final 409", "attempts     2 (1 abandoned", "response     409 Conflict"},
		},
		{
			// A WithErrorWriter of the service's own writes the answer:
			// the header, not the body, says what it is.
			name: "outcome unknown, written by a custom error writer",
			setup: func(t *testing.T, f *fixture) {
				f.claim(t, "order-1", time.Millisecond)
				c := f.takeOver(t, "order-1")
				resp := &engine.Response{
					Status: http.StatusConflict,
					Header: http.Header{"Content-Type": {"application/json"}, engine.HeaderOutcome: {"unknown"}},
					Body:   []byte(`{"error":"ORDER_OUTCOME_UNKNOWN"}`),
				}
				require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, resp, time.Hour))
			},
			want: []string{"state        outcome unknown: retries get a final 409", "attempts     2 (1 abandoned"},
		},
		{
			// The problem type without the header is an answer of the
			// service's own (or a record resolved with a copy of it).
			name: "the problem type alone is no unknown outcome",
			setup: func(t *testing.T, f *fixture) {
				c := f.claim(t, "order-1", time.Minute)
				resp := outcomeUnknownProblem()
				delete(resp.Header, engine.HeaderOutcome)
				require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, resp, time.Hour))
			},
			want: []string{"state        completed\n"},
		},
		{
			name: "another 409 is no unknown outcome",
			setup: func(t *testing.T, f *fixture) {
				c := f.claim(t, "order-1", time.Minute)
				resp := &engine.Response{Status: http.StatusConflict, Body: []byte(`{"type":"https://example.com/sold-out"}`)}
				require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, resp, time.Hour))
			},
			want: []string{"state        completed\n"},
		},
		{
			name: "binary body",
			setup: func(t *testing.T, f *fixture) {
				c := f.claim(t, "order-1", time.Minute)
				resp := &engine.Response{Status: http.StatusOK, Body: []byte{0xff, 0, 1}}
				require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, resp, time.Hour))
			},
			want: []string{"body         not shown (binary or over 2048 bytes): use -json\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(t, f)
			code := f.run("lookup", "-scope", scope, "order-1")
			require.Equal(t, exitOK, code, "stderr: %s", &f.stderr)
			out := f.stdout.String()
			assert.Contains(t, out, "scope        "+scope+"\n")
			assert.Contains(t, out, "key          order-1\n")
			for _, want := range tc.want {
				assert.Contains(t, out, want)
			}
		})
	}
}

func TestLookupTimes(t *testing.T) {
	f := newFixture(t)
	f.claim(t, "order-1", time.Minute)
	r, err := f.store.Lookup(ctx, id("order-1"))
	require.NoError(t, err)
	f.now = r.Created.Add(90 * time.Second)
	require.Equal(t, exitOK, f.run("lookup", "-scope", scope, "order-1"), "stderr: %s", &f.stderr)
	out := f.stdout.String()
	assert.Contains(t, out, "started      "+r.Created.UTC().Format(time.RFC3339)+" (1m30s ago)\n")
	assert.Contains(t, out, "lease ends   "+r.LeaseEnds.UTC().Format(time.RFC3339)+" (30s ago)\n")
	assert.Contains(t, out, "expires      "+r.Expires.UTC().Format(time.RFC3339)+" (in 59m30s)\n") // the TTL after the lease
}

func TestLookupJSON(t *testing.T) {
	f := newFixture(t)
	f.claim(t, "order-1", time.Millisecond)
	c := f.takeOver(t, "order-1")
	require.NoError(t, f.store.Complete(ctx, id("order-1"), c.Token, outcomeUnknownProblem(), time.Hour))
	require.Equal(t, exitOK, f.run("lookup", "-json", "-scope", scope, "order-1"), "stderr: %s", &f.stderr)
	var got jsonRecord
	require.NoError(t, json.Unmarshal(f.stdout.Bytes(), &got))
	assert.Equal(t, "outcome_unknown", got.State)
	assert.Equal(t, 2, got.Attempts)
	assert.Equal(t, 1, got.Abandoned)
	assert.Equal(t, int64(c.Token), got.Token)
	assert.Nil(t, got.LeaseEnds, "a completed record's lease end")
	assert.Equal(t, "66696e6765727072696e74", got.Fingerprint)
	require.NotNil(t, got.Response)
	require.NotNil(t, got.Response.Body)
	assert.Equal(t, string(outcomeUnknownProblem().Body), *got.Response.Body)
	assert.Equal(t, http.StatusConflict, got.Response.Status)
}

// TestLookupSteps: a record's steps are shown, done or only started, in
// text and in JSON.
func TestLookupSteps(t *testing.T) {
	f := newFixture(t)
	c := f.claim(t, "order-1", time.Minute)
	ss := f.store.(engine.StepStore)
	require.NoError(t, ss.SaveStep(ctx, id("order-1"), c.Token, engine.Step{Name: "charge", Fingerprint: "f1", Done: true, Result: []byte("vreceipt")}))
	require.NoError(t, ss.SaveStep(ctx, id("order-1"), c.Token, engine.Step{Name: "email", Fingerprint: "f2"}))
	require.Equal(t, exitOK, f.run("lookup", "-scope", scope, "order-1"), "stderr: %s", &f.stderr)
	assert.Contains(t, f.stdout.String(), "step         charge: done, 8 result bytes\n")
	assert.Contains(t, f.stdout.String(), "step         email: started, never finished")
	f.stdout.Reset()
	require.Equal(t, exitOK, f.run("lookup", "-json", "-scope", scope, "order-1"), "stderr: %s", &f.stderr)
	var got jsonRecord
	require.NoError(t, json.Unmarshal(f.stdout.Bytes(), &got))
	assert.Equal(t, []jsonStep{{Name: "charge", Done: true, ResultBytes: 8}, {Name: "email"}}, got.Steps)
}

func TestLookupQuotedKey(t *testing.T) {
	f := newFixture(t)
	f.claim(t, `say "hi"`, time.Minute)
	require.Equal(t, exitOK, f.run("lookup", "-scope", scope, `"say \"hi\""`), "stderr: %s", &f.stderr)
	assert.Contains(t, f.stdout.String(), "key          say \"hi\"\n")
}

func TestNotFound(t *testing.T) {
	for _, args := range [][]string{
		{"lookup", "-scope", scope, "order-9"},
		{"resolve", "-status", "201", "-scope", scope, "order-9"},
		{"forget", "-scope", scope, "order-9"},
		// Another scope's key is another record.
		{"lookup", "order-1"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			f := newFixture(t)
			f.claim(t, "order-1", time.Minute)
			assert.Equal(t, exitNotFound, f.run(args...))
			assert.Contains(t, f.stderr.String(), "no record for key")
			assert.Empty(t, f.stdout.String())
			// Nothing was made.
			_, err := f.store.Lookup(ctx, engine.ID{Scope: scope, Key: "order-9"})
			assert.ErrorIs(t, err, engine.ErrNotFound)
		})
	}
}

func TestResolve(t *testing.T) {
	f := newFixture(t)
	f.claim(t, "order-1", time.Millisecond)
	held := f.takeOver(t, "order-1")
	body := filepath.Join(t.TempDir(), "body.json")
	require.NoError(t, os.WriteFile(body, []byte(`{"order":1}`), 0o600))
	code := f.run("resolve", "-force", "-scope", scope, "-status", "201", "-body-file", body,
		"-header", "Content-Type: application/json", "-header", "location: /orders/1", "-ttl", "2h", "order-1")
	require.Equal(t, exitOK, code, "stderr: %s", &f.stderr)
	assert.Contains(t, f.stdout.String(), `resolved: key "order-1" in scope "`+scope+`", in flight before, is recorded as done with 201 Created (11 body bytes); every retry gets it for 2h0m0s`)
	assert.Contains(t, f.stdout.String(), "can no longer complete it")

	// Every retry gets the response; the holder still running is refused.
	c, err := f.store.Claim(ctx, id("order-1"), "fingerprint", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, c.Status)
	assert.Equal(t, http.StatusCreated, c.Response.Status)
	assert.Equal(t, `{"order":1}`, string(c.Response.Body))
	assert.Equal(t, map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1"}}, c.Response.Header)
	err = f.store.Complete(ctx, id("order-1"), held.Token, &engine.Response{Status: http.StatusCreated}, time.Hour)
	assert.ErrorIs(t, err, engine.ErrLeaseLost)
	r, err := f.store.Lookup(ctx, id("order-1"))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(2*time.Hour), r.Expires, time.Minute)

	// A completed record, the outcome unknown say, can be resolved again.
	require.Equal(t, exitOK, f.run("resolve", "-scope", scope, "-status", "200", "-body", "done", "order-1"), "stderr: %s", &f.stderr)
	assert.Contains(t, f.stdout.String(), "completed before, is recorded as done with 200 OK (4 body bytes); every retry gets it for 24h0m0s\n")
	assert.NotContains(t, f.stdout.String(), "can no longer complete it")
}

func TestForget(t *testing.T) {
	f := newFixture(t)
	f.claim(t, "order-1", time.Millisecond)
	held := f.takeOver(t, "order-1")
	// The holder was lost too: its lease has ended by this clock.
	f.now = f.now.Add(2 * time.Minute)
	require.Equal(t, exitOK, f.run("forget", "order-1", "-scope", scope), "stderr: %s", &f.stderr)
	assert.Contains(t, f.stdout.String(), `forgotten: key "order-1" in scope "`+scope+`", in flight before; the next request with it runs`)
	err := f.store.Extend(ctx, id("order-1"), held.Token, time.Minute)
	assert.ErrorIs(t, err, engine.ErrLeaseLost)
	c, err := f.store.Claim(ctx, id("order-1"), "another fingerprint", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, c.Status)
	assert.Equal(t, 0, c.Abandoned)
}

// TestLiveLeaseRefused: resolve and forget leave a key whose holder's lease
// is live alone, unless forced.
func TestLiveLeaseRefused(t *testing.T) {
	for _, args := range [][]string{
		{"resolve", "-scope", scope, "-status", "201", "order-1"},
		{"forget", "-scope", scope, "order-1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			f := newFixture(t)
			held := f.claim(t, "order-1", time.Minute)
			assert.Equal(t, exitLive, f.run(args...))
			assert.Contains(t, f.stderr.String(), `key "order-1" in scope "`+scope+`" is in flight until `)
			assert.Contains(t, f.stderr.String(), "pass -force to "+args[0]+" it anyway")
			assert.Empty(t, f.stdout.String())
			// Nothing changed: the holder still completes.
			require.NoError(t, f.store.Complete(ctx, id("order-1"), held.Token, &engine.Response{Status: http.StatusAccepted}, time.Hour))
		})
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string // $IDEMCTL_STORE; the fixture's when empty
		want string
	}{
		{nil, "", "no command"},
		{[]string{"show", "k"}, "", `unknown command "show"`},
		{[]string{"lookup"}, "", "lookup takes one KEY, got 0"},
		{[]string{"lookup", "a", "b"}, "", "lookup takes one KEY, got 2"},
		{[]string{"lookup", "bad\x01key"}, "", "outside printable ASCII"},
		{[]string{"lookup", "-nope", "k"}, "", "flag provided but not defined: -nope"},
		{[]string{"lookup", "-timeout", "0s", "k"}, "", "-timeout 0s is not positive"},
		{[]string{"lookup", "-store", "mongodb://root:pw@db/x", "k"}, "", `store scheme "mongodb"`},
		{[]string{"lookup", "-store", "db.internal:5432", "k"}, "", "the store is not a URL"},
		{[]string{"lookup", "-prefix", "p:", "k"}, "", "-prefix and -cluster are for a Redis store"},
		{[]string{"lookup", "-store", "redis://127.0.0.1:6379/0", "-table", "t", "k"}, "", "-table is for a PostgreSQL store"},
		{[]string{"resolve", "k"}, "", "-status 0: want a final status code, from 200 to 599"},
		// An interim status is no answer: net/http would send 200 to
		// every retry instead.
		{[]string{"resolve", "-status", "100", "k"}, "", "-status 100: want a final status code, from 200 to 599"},
		{[]string{"resolve", "-status", "199", "k"}, "", "-status 199: want a final status code, from 200 to 599"},
		// The header that marks the middleware's own "outcome unknown"
		// would make the resolved record one again.
		{[]string{"resolve", "-status", "201", "-header", "idempotent-outcome: unknown", "k"}, "", "-header Idempotent-Outcome: it marks the middleware's \"outcome unknown\" answer"},
		{[]string{"resolve", "-status", "600", "-ttl", "-1s", "k"}, "", "-ttl -1s is not positive"},
		{[]string{"resolve", "-status", "201", "-body", "x", "-body-file", "f", "k"}, "", "-body and -body-file: give one"},
		{[]string{"resolve", "-status", "201", "-body-file", "/nonexistent/body", "k"}, "", "-body-file: open /nonexistent/body"},
		{[]string{"resolve", "-status", "201", "-header", "no colon", "k"}, "", `"no colon" is not 'Name: value'`},
		{[]string{"resolve", "-status", "201", "-header", "X: a\r\nInjected: b", "k"}, "", "is not 'Name: value'"},
		{[]string{"forget", "-json", "k"}, "", "flag provided but not defined: -json"},
		{[]string{"lookup", "-force", "k"}, "", "flag provided but not defined: -force"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			f := newFixture(t)
			assert.Equal(t, exitUsage, f.run(tc.args...))
			assert.Contains(t, f.stderr.String(), tc.want)
			assert.Contains(t, f.stderr.String(), "Run 'idemctl -h' for usage.")
			assert.Empty(t, f.opened, "the store was opened")
			assert.NotContains(t, f.stderr.String(), "s3cret")
		})
	}
}

func TestNoStore(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"lookup", "k"}, environment{
		stdout: &stdout, stderr: &stderr,
		getenv: func(string) string { return "" },
		open: func(context.Context, storeConfig) (engine.Store, func(), error) {
			return nil, nil, errors.New("opened")
		},
		now: time.Now,
	})
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr.String(), "no store: set -store or IDEMCTL_STORE")
}

func TestHelp(t *testing.T) {
	f := newFixture(t)
	for _, args := range [][]string{{"-h"}, {"lookup", "-h"}, {"resolve", "-help"}} {
		assert.Equal(t, exitOK, f.run(args...), "%v", args)
		assert.Contains(t, f.stdout.String(), "Usage:\n  idemctl lookup")
		assert.Contains(t, f.stdout.String(), "-scope scope")
	}
	f.run("resolve", "-h")
	assert.Contains(t, f.stdout.String(), "-status status")
	assert.NotContains(t, f.stdout.String(), "-json", "lookup's flag in resolve's help")

	// The help of the command lists the flags of every subcommand, each
	// once.
	require.Equal(t, exitOK, f.run("-h"))
	out := f.stdout.String()
	for _, flag := range []string{"-store", "-scope", "-timeout", "-json", "-status", "-body", "-body-file", "-header", "-ttl", "-force"} {
		lines := regexp.MustCompile(`(?m)^  `+flag+`( |$)`).FindAllString(out, -1)
		assert.Len(t, lines, 1, "%s in:\n%s", flag, out)
	}
	for _, heading := range []string{"Flags of every command:\n", "Flags of lookup:\n", "Flags of resolve:\n", "Flags of resolve and forget:\n"} {
		assert.Contains(t, out, heading)
	}
}

// TestStoreFlags: the flags reach the opener as given, and the URL comes from
// -store before the environment.
func TestStoreFlags(t *testing.T) {
	f := newFixture(t)
	f.claim(t, "k", time.Minute)
	require.Equal(t, exitOK, f.run("lookup", "-table", "billing.idempotency", "-scope", scope, "k"), "stderr: %s", &f.stderr)
	require.Equal(t, exitOK, f.run("lookup", "-store", "rediss://:pw@cache:6380/2", "-prefix", "orders:", "-cluster", "-scope", scope, "k"), "stderr: %s", &f.stderr)
	assert.Equal(t, []storeConfig{
		{url: "postgres://operator:s3cret@db.internal:5432/orders", kind: kindPostgres, table: "billing.idempotency"},
		{url: "rediss://:pw@cache:6380/2", kind: kindRedis, prefix: "orders:", cluster: true},
	}, f.opened)
}

// notInspector is a Store that cannot look records up.
type notInspector struct{ engine.Store }

func TestStoreWithoutInspector(t *testing.T) {
	f := newFixture(t)
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"lookup", "-store", "redis://127.0.0.1:6379/0", "k"}, environment{
		stdout: &stdout, stderr: &stderr,
		getenv: func(string) string { return "" },
		open: func(context.Context, storeConfig) (engine.Store, func(), error) {
			return notInspector{f.store}, func() {}, nil
		},
		now: time.Now,
	})
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, stderr.String(), "the Redis store (main.notInspector) cannot look records up: it does not implement engine.Inspector")
}

// TestStoreFailure: a store that fails is exit status 1, and its error is
// printed without the URL's password.
func TestStoreFailure(t *testing.T) {
	f := newFixture(t)
	f.store.Close()
	assert.Equal(t, exitFailed, f.run("lookup", "k"))
	assert.Contains(t, f.stderr.String(), "memstore: lookup: idempotency store closed")
}

// TestErrorsRedacted: an error that quotes the store's URL, or its password,
// is printed with neither.
func TestErrorsRedacted(t *testing.T) {
	for _, url := range []string{
		"postgres://operator:pa55@db.internal:5432/orders",
		"postgres://operator:p%40ss@db.internal:5432/orders",
		"redis://operator:pa55@cache.internal:6379/0",
		"postgres://operator@db.internal/orders?password=pa55",
	} {
		t.Run(url, func(t *testing.T) {
			c := storeConfig{url: url}
			require.NoError(t, c.classify())
			got := c.redact(errors.New("dial " + url + ": refused; password pa55, p@ss, p%40ss"))
			for _, secret := range []string{"pa55", "p@ss", "p%40ss", url} {
				if strings.Contains(url, secret) {
					assert.NotContains(t, got, secret)
				}
			}
			assert.Contains(t, got, "dial "+c.kind+" at ")
		})
	}
}

// TestCredentialsNeverPrinted: connecting fails, at a port where nothing
// listens, and neither the URL nor its password is in what is printed.
func TestCredentialsNeverPrinted(t *testing.T) {
	const password = "pa55-w0rd"
	for _, url := range []string{
		"postgres://operator:" + password + "@127.0.0.1:1/orders?connect_timeout=2",
		"postgresql://operator@127.0.0.1:1/orders?password=" + password + "&connect_timeout=2",
		"redis://operator:" + password + "@127.0.0.1:1/0",
		"redis://:" + password + "@127.0.0.1:1/0",
		"postgres://operator:" + password + "@127.0.0.1:1/orders?sslmode=bogus",
		"redis://operator:" + password + "@127.0.0.1:1/notanumber",
	} {
		t.Run(strings.ReplaceAll(url, password, "PASSWORD"), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(ctx, []string{"lookup", "-timeout", "5s", "k"}, environment{
				stdout: &stdout, stderr: &stderr,
				getenv: func(string) string { return url },
				open:   openStore,
				now:    time.Now,
			})
			assert.Equal(t, exitFailed, code)
			assert.NotEmpty(t, stderr.String())
			assert.NotContains(t, stderr.String(), password)
			assert.NotContains(t, stdout.String(), password)
			t.Log(stderr.String())
		})
	}
}

// TestLookupCustomErrorWriter: the "outcome unknown" answer that the
// middleware records through an error writer of the service's own, which
// knows nothing of problem documents, is shown as such: the record's
// header says what it is, not its body.
func TestLookupCustomErrorWriter(t *testing.T) {
	f := newFixture(t)
	mw, err := server.New(f.store,
		server.WithConfig(engine.Config{Abandoned: engine.RefuseAbandoned}),
		server.WithScope(func(*http.Request) (string, error) { return scope, nil }),
		// The lost holder's, claimed below.
		server.WithFingerprint(func(*http.Request, []byte) (string, error) { return "fingerprint", nil }),
		server.WithErrorWriter(func(w http.ResponseWriter, _ *http.Request, err error) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprintf(w, `{"error":%q}`, err.Error())
		}))
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	// A holder was lost; the retry takes the key over, and is refused.
	f.claim(t, "order-1", time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set(server.HeaderKey, "order-1")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.Header.Get(engine.HeaderOutcome) == "unknown" {
			break
		}
		require.Equal(t, http.StatusConflict, resp.StatusCode, "before the lost holder's lease ends: in flight")
		require.False(t, time.Now().After(deadline), "the 1ms lease was not taken over in 10s")
	}

	require.Equal(t, exitOK, f.run("lookup", "-scope", scope, "order-1"), "stderr: %s", &f.stderr)
	assert.Contains(t, f.stdout.String(), "state        outcome unknown: retries get a final 409")
	assert.NotContains(t, f.stdout.String(), "application/problem+json", "the service's own body")
	require.Equal(t, exitOK, f.run("lookup", "-json", "-scope", scope, "order-1"), "stderr: %s", &f.stderr)
	var got jsonRecord
	require.NoError(t, json.Unmarshal(f.stdout.Bytes(), &got))
	assert.Equal(t, "outcome_unknown", got.State)
}
