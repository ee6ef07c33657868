package idemtest_test

import (
	"encoding/hex"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/idemtest"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestEachCheckAlone runs every check on its own, as -checks does, against
// a server that honours it and one that breaks it: a check run alone
// establishes its own preconditions (it runs, unreported, the checks whose
// evidence it needs), so it neither passes a broken server silently nor
// fails a good one.
func TestEachCheckAlone(t *testing.T) {
	plain := func(w http.ResponseWriter, r *http.Request, err error) {
		var e *server.Error
		if assert.ErrorAs(t, err, &e) {
			http.Error(w, e.Title, e.Status)
		}
	}
	everyone := server.WithScope(func(*http.Request) (string, error) { return "everyone", nil })
	unmarked := server.WithReplayedHeader("X-Unknown") // not one the kit recognises
	for _, tc := range []struct {
		name string
		// broken returns the broken server; done is closed once its
		// check has returned.
		broken func(t *testing.T, done <-chan struct{}) http.Handler
		edit   func(tg *idemtest.Target)
		want   idemtest.Status // the broken server's verdict
	}{
		{"first-request", func(t *testing.T, _ <-chan struct{}) http.Handler { return protect(t, refuses()) }, nil, idemtest.StatusFail},
		{"replay", func(*testing.T, <-chan struct{}) http.Handler { return &orders{} }, nil, idemtest.StatusFail},
		{"replay-marked", func(t *testing.T, _ <-chan struct{}) http.Handler { return protect(t, &orders{}, unmarked) }, nil, idemtest.StatusAdvisory},
		{"key-mismatch", func(*testing.T, <-chan struct{}) http.Handler { return newCheckThenInsert(0) }, nil, idemtest.StatusFail},
		{"missing-key", func(*testing.T, <-chan struct{}) http.Handler { return &orders{} }, nil, idemtest.StatusFail},
		// Keys optional, malformed keys used as keys, replays unmarked:
		// alone, the check used to take the equal answers for "cannot
		// tell" and pass.
		{"malformed-key", func(*testing.T, <-chan struct{}) http.Handler { return newCheckThenInsert(0) },
			func(tg *idemtest.Target) { tg.KeysOptional = true }, idemtest.StatusFail},
		{"key-forms", func(*testing.T, <-chan struct{}) http.Handler { return newCheckThenInsert(0) }, nil, idemtest.StatusFail},
		{"concurrent", func(*testing.T, <-chan struct{}) http.Handler { return newCheckThenInsert(200 * time.Millisecond) }, nil, idemtest.StatusFail},
		{"dropped-response", func(t *testing.T, done <-chan struct{}) http.Handler { return stuckWhenDropped(t, done) },
			func(tg *idemtest.Target) { tg.Patience = 300 * time.Millisecond }, idemtest.StatusFail},
		// Keys shared across callers, replays unmarked: alone, the check
		// used to pass, not knowing that executions answer differently.
		{"cross-tenant", func(t *testing.T, _ <-chan struct{}) http.Handler { return protect(t, &orders{}, everyone, unmarked) }, nil, idemtest.StatusFail},
		{"5xx-not-cached", func(t *testing.T, _ <-chan struct{}) http.Handler { return stuckAfter5xx(protect(t, &orders{})) },
			func(tg *idemtest.Target) { tg.Patience = 300 * time.Millisecond }, idemtest.StatusFail},
		{"problem-json", func(t *testing.T, _ <-chan struct{}) http.Handler {
			return protect(t, &orders{}, server.WithErrorWriter(plain))
		}, nil, idemtest.StatusAdvisory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			defer close(done) // before the servers close, which waits for their handlers
			for _, side := range []struct {
				name string
				h    http.Handler
				want idemtest.Status
			}{
				{"compliant", protect(t, &orders{}), idemtest.StatusPass},
				{"broken", tc.broken(t, done), tc.want},
			} {
				srv := start(t, side.h)
				tg := target(srv.URL)
				tg.KeyForm = idemtest.KeyBoth
				tg.MaxKeyLen = 255
				tg.Require5xxRelease = true
				if tc.edit != nil {
					tc.edit(&tg)
				}
				tg.Checks = []string{tc.name}
				report := check(t, tg)
				require.Len(t, report.Results, 1, "only the check asked for is reported")
				res := report.Results[0]
				assert.Equal(t, side.want, res.Status, "%s: %s\nsent: %s\ngot: %s", side.name, res.Detail, res.Sent, res.Got)
			}
		})
	}
}

// refuses answers every request 401, as a server given the wrong
// credentials does.
func refuses() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "who are you?", http.StatusUnauthorized)
	})
}

// stuckWhenDropped does not finish the request whose client goes away (the
// kit's dropped request, on a connection it asks to be closed) until
// release is closed, and leaves its key in flight.
func stuckWhenDropped(t *testing.T, release <-chan struct{}) http.Handler {
	h := &orders{}
	return protect(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Close {
			<-release
		}
		h.ServeHTTP(w, r)
	}))
}

// TestConcurrentSlowFirstAnswer: a server that handles requests one after
// another, whose first answer is slow (a cold start), shows no overlap. Run
// alone, the check used to compare that answer with the time it took to
// open a connection, and read "they waited" into it.
func TestConcurrentSlowFirstAnswer(t *testing.T) {
	store, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	mw, err := server.New(store)
	require.NoError(t, err)
	var runs atomic.Int64
	o := &orders{}
	coldStart := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			timer := time.NewTimer(80 * time.Millisecond) // the first request's warm-up
			<-timer.C
		}
		o.ServeHTTP(w, r)
	})
	srv := start(t, oneAtATime(mw.Handler(coldStart)))
	tg := target(srv.URL)
	tg.Checks = []string{"concurrent"}
	res := check(t, tg).Results[0]
	assert.Equal(t, idemtest.StatusInconclusive, res.Status, "%s\n%s", res.Detail, res.Got)
	assert.Contains(t, res.Detail, "No duplicate was seen reaching the idempotency layer while the first ran there")
	assert.Contains(t, res.Detail, "an endpoint that takes 100ms or more")
}

// sharedDefault gives every request without a valid key one key of its
// own, "shared-default": requests without a key, or with a malformed one,
// share a record, and the later ones get the first one's answer, marked as
// a replay.
func sharedDefault(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Values("Idempotency-Key"); len(v) != 1 || !plainKey(strings.Trim(v[0], `"`)) {
			r.Header.Set("Idempotency-Key", "shared-default")
		}
		h.ServeHTTP(w, r)
	})
}

// TestReplayIsNotARun: when a request without a key, or with a malformed
// one, gets a stored answer marked as a replay, the checks say so, and do
// not say that the request ran.
func TestReplayIsNotARun(t *testing.T) {
	srv := start(t, sharedDefault(protect(t, &orders{})))
	tg := target(srv.URL)
	// An earlier request without a key, whose answer the others get.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(string(tg.Body(0))))
	require.NoError(t, err)
	req.Header = tg.Header.Clone()
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	for _, tc := range []struct{ check, want string }{
		{"missing-key", "got a stored answer (marked as a replay)"},
		{"malformed-key", "Answered with a stored answer (marked as a replay)"},
	} {
		tg.Checks = []string{tc.check}
		res := check(t, tg).Results[0]
		assert.Equal(t, idemtest.StatusFail, res.Status, tc.check)
		assert.Contains(t, res.Detail, tc.want, tc.check)
		assert.NotContains(t, res.Detail, "ran without a key", tc.check)
		assert.NotContains(t, res.Detail, "Ran, not refused", tc.check)
	}
}

// utf8Keys stands for a server that documents UTF-8 keys: a key that is
// UTF-8 but not ASCII reaches the middleware hex-encoded, and one that is
// not UTF-8 is refused.
func utf8Keys(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("Idempotency-Key")
		switch {
		case !utf8.ValidString(v):
			http.Error(w, "the key is not UTF-8", http.StatusBadRequest)
			return
		case strings.ContainsFunc(v, func(c rune) bool { return c >= utf8.RuneSelf }):
			r.Header.Set("Idempotency-Key", "u8-"+hex.EncodeToString([]byte(v)))
		}
		h.ServeHTTP(w, r)
	})
}

// TestKeyAlphabet: a server that documents UTF-8 keys is judged by that
// alphabet when it is declared: it must take a key with non-ASCII
// characters and refuse one that is not UTF-8. Undeclared, the draft's
// alphabet applies.
func TestKeyAlphabet(t *testing.T) {
	srv := start(t, utf8Keys(protect(t, &orders{})))
	tg := target(srv.URL)
	tg.KeyAlphabet = idemtest.AlphabetUTF8
	report := check(t, tg)
	for _, res := range report.Results {
		want := idemtest.StatusPass
		if res.Name == "key-forms" {
			want = idemtest.StatusNotApplicable
		}
		assert.Equal(t, want, res.Status, "%s: %s", res.Name, res.Detail)
	}
	res, _ := report.Result("first-request")
	assert.Contains(t, res.Sent, "clé-", "a valid key with non-ASCII characters")
	res, _ = report.Result("malformed-key")
	assert.Contains(t, res.Sent, "a byte that is not UTF-8")
	assert.Contains(t, report.Policy.String(), "UTF-8 keys")

	tg.KeyAlphabet = ""
	tg.Checks = []string{"malformed-key"}
	res = check(t, tg).Results[0]
	assert.Equal(t, idemtest.StatusFail, res.Status)
	assert.Contains(t, res.Detail, "Ran, not refused: the key with a non-ASCII character.")
}

// exactly36 answers 500 to any key that is not 36 bytes long, as a
// middleware that takes only UUIDs and fails on anything else does.
func exactly36(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(strings.Trim(r.Header.Get("Idempotency-Key"), `"`)) != 36 {
			http.Error(w, "invalid key length", http.StatusInternalServerError)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// TestKeyLengths: keys of several lengths and forms show a server that
// takes keys of one length only; the kit used to send 36-byte keys alone,
// and passed it. Declared, the length is judged as such, and the keys one
// byte too short and too long must be refused with 400, not 500.
func TestKeyLengths(t *testing.T) {
	srv := start(t, exactly36(protect(t, &orders{})))
	tg := target(srv.URL)
	report := check(t, tg)
	res, _ := report.Result("first-request")
	assert.Equal(t, idemtest.StatusFail, res.Status)
	for _, name := range []string{"the 12-byte key (500)", "the 64-byte hex key (500)", "the 255-byte key (500)", "the stripe-go style key (500)"} {
		assert.Contains(t, res.Detail, name)
	}
	assert.Contains(t, res.Detail, "The other checks send the keys that were taken: the 36-byte UUID key.")
	assert.NotContains(t, res.Detail, "the 36-byte UUID key (500)")
	// The other checks ran, with the keys that were taken.
	res, _ = report.Result("replay")
	assert.Equal(t, idemtest.StatusPass, res.Status, res.Detail)

	tg.MinKeyLen, tg.MaxKeyLen = 36, 36
	report = check(t, tg)
	res, _ = report.Result("first-request")
	assert.Equal(t, idemtest.StatusPass, res.Status, res.Detail)
	res, _ = report.Result("malformed-key")
	assert.Equal(t, idemtest.StatusFail, res.Status)
	assert.Contains(t, res.Detail, "Answered with a server error, which tells a client to retry a request that can never succeed")
	assert.Contains(t, res.Detail, "the 37-byte key (500)")
	assert.Contains(t, res.Detail, "the 35-byte key (500)")
	assert.Contains(t, report.Policy.String(), "keys of exactly 36 bytes")
}

// anyByteKeys stands for a server that documents keys of any byte but
// control characters: a key with bytes outside printable ASCII, UTF-8 or
// not, reaches the middleware hex-encoded; a control character is refused
// (as the middleware refuses a tab).
func anyByteKeys(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get("Idempotency-Key")
		if strings.ContainsFunc(v, func(c rune) bool { return c >= utf8.RuneSelf || c == utf8.RuneError }) {
			r.Header.Set("Idempotency-Key", "b-"+hex.EncodeToString([]byte(v)))
		}
		h.ServeHTTP(w, r)
	})
}

// TestKeyAlphabetBytes: a server that documents keys of any byte but
// control characters can be declared so, and passes: it takes keys with
// non-ASCII characters and with bytes that are not UTF-8, and only keys
// with a control character are malformed. Declared as UTF-8 or ASCII, it
// fails malformed-key, since the kit's key outside those alphabets is
// valid for it.
func TestKeyAlphabetBytes(t *testing.T) {
	srv := start(t, anyByteKeys(protect(t, &orders{})))
	tg := target(srv.URL)
	tg.KeyAlphabet = idemtest.AlphabetBytes
	report := check(t, tg)
	for _, res := range report.Results {
		want := idemtest.StatusPass
		if res.Name == "key-forms" {
			want = idemtest.StatusNotApplicable
		}
		assert.Equal(t, want, res.Status, "%s: %s", res.Name, res.Detail)
	}
	res, _ := report.Result("first-request")
	assert.Contains(t, res.Sent, "clé-", "a valid key with non-ASCII characters")
	assert.Contains(t, res.Sent, "`cl\\xe9-", "a valid key with bytes that are not UTF-8, shown escaped")
	assert.True(t, utf8.ValidString(res.Sent), "the report is text")
	res, _ = report.Result("malformed-key")
	assert.Contains(t, res.Sent, "(a tab)")
	assert.NotContains(t, res.Sent, "not UTF-8")
	assert.Contains(t, report.Policy.String(), "keys of any bytes but control characters")

	for _, alphabet := range []idemtest.KeyAlphabet{idemtest.AlphabetASCII, idemtest.AlphabetUTF8} {
		tg.KeyAlphabet = alphabet
		tg.Checks = []string{"malformed-key"}
		res = check(t, tg).Results[0]
		assert.Equal(t, idemtest.StatusFail, res.Status, "declared %s: %s", alphabet, res.Detail)
	}
}
