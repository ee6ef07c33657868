package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/idemtest"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// orders creates an order per execution; X-Fail makes it fail with 500.
func orders() http.Handler {
	var created atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "induced failure", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, created.Add(1))
	})
}

// protect puts mw in front of h, and holds each run of h until a duplicate
// of its request (the same key) has been answered, or for 50ms at most: the
// concurrent check's duplicates then meet the first in flight, as they
// would a handler that takes time, without depending on the scheduler. The
// concurrent check's requests (with Expect: 100-continue) are held for up
// to a second, so that a late duplicate still meets the first; once a
// duplicate has been answered, the others go on, and those that come in
// the second after it (the check's request under another key) are held for
// 50ms only.
func protect(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
	var (
		mu      sync.Mutex
		running = map[string]chan struct{}{}
		settled = make(chan struct{})
		lastAt  time.Time
	)
	type ranKey struct{}
	protected := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ran, ok := r.Context().Value(ranKey{}).(*atomic.Bool); ok {
			ran.Store(true)
		}
		key, answered := r.Header.Get("Idempotency-Key"), make(chan struct{})
		var burst chan struct{} // nil, which never ends the wait, but in a burst
		window := 50 * time.Millisecond
		mu.Lock()
		running[key] = answered
		if r.Header.Get("Expect") != "" && time.Since(lastAt) > time.Second {
			burst, window = settled, time.Second
		}
		mu.Unlock()
		timer := time.NewTimer(window)
		select {
		case <-answered:
		case <-burst:
		case <-timer.C:
		}
		timer.Stop()
		h.ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran := new(atomic.Bool)
		protected.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ranKey{}, ran)))
		if !ran.Load() {
			mu.Lock()
			if answered := running[r.Header.Get("Idempotency-Key")]; answered != nil {
				close(answered)
				delete(running, r.Header.Get("Idempotency-Key"))
				close(settled)
				settled, lastAt = make(chan struct{}), time.Now()
			}
			mu.Unlock()
		}
	})
}

func start(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func compliant(t *testing.T) string {
	t.Helper()
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	return start(t, protect(mw.Handler, orders()))
}

// every is the flags that make every check applicable to our servers.
func every(url string) []string {
	return []string{
		"-H", "Authorization: Bearer alice",
		"-H2", "Authorization: Bearer bob",
		"-fail-header", "X-Fail: 1",
		"-d", `{"sku":"A1","note":"{{variant}}"}`,
		url + "/orders",
	}
}

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCompliantServer(t *testing.T) {
	url := compliant(t)
	code, out, errOut := runCmd(t, append([]string{"-key-form", "both", "-max-key-len", "255", "-require-5xx-release"}, every(url)...)...)
	assert.Equal(t, 0, code, out)
	assert.Empty(t, errOut)
	assert.Contains(t, out, "Checked "+url+"/orders\n")
	assert.Regexp(t, `(?m)^CHECK +RESULT +NOTE$`, out)
	for _, c := range idemtest.Checks() {
		assert.Regexp(t, `(?m)^`+c.Name+` +pass`, out)
	}
	assert.Contains(t, out, "\nPolicy: keys required, sent bare and quoted; keys of at most 255 bytes; release after 5xx required.\n")
	assert.True(t, strings.HasSuffix(out, "\n12 passed, 0 failed\n"), out)
	assert.NotContains(t, out, "---", "no failures to detail")
}

func TestNoncompliantServer(t *testing.T) {
	url := start(t, orders()) // no middleware: it ignores the key
	code, out, _ := runCmd(t, every(url)...)
	assert.Equal(t, 1, code)
	assert.Regexp(t, `(?m)^replay +FAIL +The repeat got another body: the request ran again\.$`, out)
	assert.Contains(t, out, "\n--- FAIL concurrent: ")
	assert.Contains(t, out, "\n    sent: 10 at once")
	assert.Contains(t, out, "\n    want: one effect")
	assert.Contains(t, out, "\n* Every request ran as if it had no key")
	assert.Contains(t, out, "-key-header")
	assert.Regexp(t, `(?m)^2 passed, 7 failed, 3 not applicable$`, out)
	assert.NotContains(t, out, "Bearer alice", "credentials never appear")
}

// TestTableNotes: the notes are whole, wrapped under their column, and no
// line of the table is longer than the table's width.
func TestTableNotes(t *testing.T) {
	url := start(t, orders())
	code, out, _ := runCmd(t, every(url)...)
	assert.Equal(t, 1, code)
	table := out[strings.Index(out, "CHECK"):strings.Index(out, "\nPolicy:")]
	for line := range strings.Lines(table) {
		assert.LessOrEqual(t, len(strings.TrimRight(line, "\n")), tableWidth, line)
	}
	assert.NotContains(t, table, "...", "notes are not cut")
	// The whole of the missing-key check's detail, its second sentence
	// going on on a line of its own, indented under the note column.
	assert.Regexp(t, `(?m)^missing-key +FAIL +The request ran without a key\. If keys are optional for this target, say\n {26}so \(Target\.KeysOptional, idemcheck -keys-optional\)\.$`, table)
}

func TestUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	code, out, errOut := runCmd(t, every(url)...)
	assert.Equal(t, 3, code)
	assert.Empty(t, out, "no checks, no table")
	assert.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
	assert.Contains(t, errOut, "idemcheck: idemtest: target unreachable: "+strings.TrimPrefix(url, "http://"))
}

func TestAdvisoryOnly(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store, server.WithReplayedHeader("X-Replayed"))
	require.NoError(t, err)
	url := start(t, protect(mw.Handler, orders()))
	code, out, _ := runCmd(t, every(url)...)
	assert.Equal(t, 0, code, "an advisory is not a failure:\n%s", out)
	assert.Regexp(t, `(?m)^replay-marked +advisory +The replay is not marked`, out)
	assert.Contains(t, out, "\n--- advisory replay-marked: ")
	assert.Contains(t, out, "\n10 passed, 0 failed, 1 not applicable, 1 advisory\n")
}

// TestPolicies: a server that stores 5xx, as the draft allows, is advised
// by default and failed when release-5xx is required; the report says which
// policy it was judged by.
func TestPolicies(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store, server.WithKeep(func(int) bool { return true }))
	require.NoError(t, err)
	url := start(t, protect(mw.Handler, orders()))
	args := append([]string{"-checks", "first-request,5xx-not-cached"}, every(url)...)

	code, out, _ := runCmd(t, args...)
	assert.Equal(t, 0, code, out)
	assert.Regexp(t, `(?m)^5xx-not-cached +advisory +The 5xx was stored and replayed`, out)
	assert.Contains(t, out, "\nPolicy: keys required, sent bare; no key length limit probed; release after 5xx advisory.\n")

	code, out, _ = runCmd(t, append([]string{"-require-5xx-release"}, args...)...)
	assert.Equal(t, 1, code, out)
	assert.Regexp(t, `(?m)^5xx-not-cached +FAIL +The 5xx was stored and replayed`, out)
	assert.Contains(t, out, "release after 5xx required.\n")
}

func TestJSON(t *testing.T) {
	url := start(t, orders())
	code, out, _ := runCmd(t, append([]string{"-json", "-checks", "first-request,replay,cross-tenant"}, every(url)...)...)
	assert.Equal(t, 1, code)
	var doc struct {
		Target  string
		Results []idemtest.Result
		Summary summary
		OK      bool
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.Equal(t, url+"/orders", doc.Target)
	assert.False(t, doc.OK)
	require.Len(t, doc.Results, 3)
	assert.Equal(t, idemtest.Result{Name: "first-request", Status: idemtest.StatusPass}.Status, doc.Results[0].Status)
	assert.Equal(t, "replay", doc.Results[1].Name)
	assert.Equal(t, idemtest.StatusFail, doc.Results[1].Status)
	assert.NotEmpty(t, doc.Results[1].Sent)
	assert.NotEmpty(t, doc.Results[1].Got)
	assert.NotEmpty(t, doc.Results[1].Want)
	assert.Equal(t, summary{Passed: 1, Failed: 2}, doc.Summary)

	code, out, _ = runCmd(t, append([]string{"-json"}, every(compliant(t))...)...)
	assert.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.True(t, doc.OK)
	assert.Equal(t, summary{Passed: 11, NotApplicable: 1}, doc.Summary)
	var policy struct{ Policy map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &policy))
	assert.Equal(t, map[string]any{"keys_optional": false, "key_form": "bare", "max_key_len": 0.0, "key_alphabet": "ascii", "release_5xx_required": false}, policy.Policy)
}

func TestHelp(t *testing.T) {
	code, out, errOut := runCmd(t, "-h")
	assert.Equal(t, 0, code)
	assert.Empty(t, errOut)
	assert.Contains(t, out, "Usage: idemcheck [flags] URL")
	for _, c := range idemtest.Checks() {
		assert.Regexp(t, `(?m)^  `+c.Name+`$`, out)
		first := strings.Fields(c.Description)
		assert.Contains(t, out, strings.Join(first[:3], " "), "the description of %s", c.Name)
	}
	for _, flag := range []string{"-H header", "-H2 header", "-fail-header header", "-d body", "-json", "-n int", "-keys-optional", "-timeout duration",
		"-key-form form", "-max-key-len bytes", "-min-key-len bytes", "-key-alphabet string", "-require-5xx-release"} {
		assert.Contains(t, out, "  "+flag+"\n")
	}
	assert.Contains(t, out, "Exit status: 0")
	assert.Contains(t, out, "3 when the endpoint's host\ncannot be reached")
}

func TestUsageErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"no URL":        {"-H", "A: b"},
		"two URLs":      {"http://a", "http://b"},
		"URL twice":     {"-url", "http://a", "http://b"},
		"unknown flag":  {"-nope", "http://a"},
		"bad header":    {"-H", "NoColon", "http://a"},
		"header name":   {"-H", "Bad Name: x", "http://a"},
		"missing file":  {"-d", "@" + filepath.Join(t.TempDir(), "missing.json"), "http://a"},
		"bad scheme":    {"ftp://example.com"},
		"unknown check": {"-checks", "replay,nope", "http://a"},
		"concurrency":   {"-n", "1", "http://a"},
		"bad duration":  {"-timeout", "soon", "http://a"},
		"key in header": {"-H", "Idempotency-Key: x", "http://a"},
		"negative wait": {"-patience", "-1s", "http://a"},
		"key form":      {"-key-form", "shouted", "http://a"},
		"key length":    {"-max-key-len", "-5", "http://a"},
		"min over max":  {"-min-key-len", "40", "-max-key-len", "36", "http://a"},
		"alphabet":      {"-key-alphabet", "klingon", "http://a"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCmd(t, args...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			assert.True(t, strings.HasPrefix(errOut, "idemcheck: "), errOut)
		})
	}
	_, _, errOut := runCmd(t, "-checks", "replay,nope", "http://a")
	assert.Contains(t, errOut, `no check is named "nope"; the checks are `+strings.Join(func() (names []string) {
		for _, c := range idemtest.Checks() {
			names = append(names, c.Name)
		}
		return names
	}(), ", "))
}

func TestParseArgs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "order.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"sku":"A1","n":{{variant}}}`), 0o600))
	opts, err := parseArgs([]string{
		"-X", "PUT", "-H", "Authorization: Bearer a", "-H", "X-Tenant:  t1 ",
		"-H2", "Authorization: Bearer b", "-fail-header", "X-Fail: yes",
		"-d", "@" + file, "-n", "4", "-key-header", "X-Key", "-replay-header", "X-Replay",
		"-keys-optional", "-timeout", "3s", "-patience", "2s", "-drop-after", "50ms",
		"-key-form", "quoted", "-max-key-len", "64", "-min-key-len", "8", "-key-alphabet", "bytes", "-require-5xx-release",
		"-checks", "replay, concurrent", "-json", "-url", "https://api.example.com/v1/orders?x=1",
	}, io.Discard)
	require.NoError(t, err)
	tg := opts.target
	assert.True(t, opts.json)
	assert.Equal(t, "https://api.example.com/v1/orders?x=1", tg.URL)
	assert.Equal(t, "PUT", tg.Method)
	assert.Equal(t, http.Header{
		"Authorization": {"Bearer a"}, "X-Tenant": {"t1"}, "Content-Type": {"application/json"},
	}, tg.Header)
	assert.Equal(t, http.Header{"Authorization": {"Bearer b"}}, tg.SecondCredential)
	assert.Equal(t, http.Header{"X-Fail": {"yes"}}, tg.FailHeader)
	assert.Equal(t, `{"sku":"A1","n":1}`, string(tg.Body(1)))
	assert.Equal(t, 4, tg.Concurrency)
	assert.Equal(t, "X-Key", tg.KeyHeader)
	assert.Equal(t, "X-Replay", tg.ReplayedHeader)
	assert.True(t, tg.KeysOptional)
	assert.Equal(t, idemtest.KeyQuoted, tg.KeyForm)
	assert.Equal(t, 64, tg.MaxKeyLen)
	assert.Equal(t, 8, tg.MinKeyLen)
	assert.Equal(t, idemtest.AlphabetBytes, tg.KeyAlphabet)
	assert.True(t, tg.Require5xxRelease)
	assert.Equal(t, 3*time.Second, tg.Timeout)
	assert.Equal(t, 2*time.Second, tg.Patience)
	assert.Equal(t, 50*time.Millisecond, tg.DropAfter)
	assert.Equal(t, []string{"replay", "concurrent"}, tg.Checks)
	assert.Nil(t, tg.Client)

	opts, err = parseArgs([]string{"-H", "Content-Type: text/plain", "-d", "hello", "-insecure", "http://a"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "text/plain", opts.target.Header.Get("Content-Type"))
	assert.Equal(t, "hello ", string(opts.target.Body(1)), "a body without the placeholder varies by a trailing space")
	require.NotNil(t, opts.target.Client)
	opts.target.Client.CloseIdleConnections()

	opts, err = parseArgs([]string{"http://a"}, io.Discard)
	require.NoError(t, err)
	assert.Nil(t, opts.target.Body, "the kit's default body")
}
