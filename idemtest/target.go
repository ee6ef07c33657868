package idemtest

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The headers of the protocol, the defaults of Target.KeyHeader and
// Target.ReplayedHeader.
const (
	headerKey      = "Idempotency-Key"
	headerReplayed = "Idempotent-Replayed"
)

// Defaults for the Target fields left at their zero value.
const (
	defaultMethod      = http.MethodPost
	defaultConcurrency = 10
	defaultTimeout     = 10 * time.Second
	defaultPatience    = 10 * time.Second
	defaultDropAfter   = 100 * time.Millisecond

	// placeholder is replaced by the variant number in a BodyTemplate.
	placeholder = "{{variant}}"
	// defaultBody is the template of the body sent when Target.Body is
	// nil, as application/json unless Target.Header names a Content-Type.
	defaultBody = `{"idemtest_variant":` + placeholder + `}`
)

// maxKeyProbe bounds Target.MaxKeyLen, well under the header size that HTTP
// servers accept (8 KiB and more), so that the over-long key is refused, if
// it is, for its length rather than for the size of the header.
const maxKeyProbe = 4096

// Target is the endpoint that Check examines, and how to make a valid request
// to it. The zero value of every field but URL or Handler has a default.
//
// Every check sends the same request, Body(0), with the same headers, under a
// fresh key of its own; the key-mismatch check also sends Body(1). The
// endpoint must therefore accept Body(0) again and again under different
// keys, as an API that creates orders accepts two orders for the same item.
type Target struct {
	// URL is the base URL of the server under test: http or https, such as
	// "https://api.example.com/v1". Exactly one of URL and Handler is set.
	URL string

	// Handler, when URL is empty, is the server under test: Check serves
	// it on a loopback httptest.Server for the duration of the check, so
	// that every check, including those that need a connection of their
	// own, runs over real HTTP. Check returns once the handler has
	// returned from every request; the requests it has not answered when
	// the checks end have their connections closed first.
	Handler http.Handler

	// Path is appended to the base URL to make the endpoint under test,
	// such as "/orders". It may carry a query.
	Path string

	// Method is the request method, POST by default.
	Method string

	// Header is sent with every request: the credentials, Content-Type and
	// whatever else the endpoint needs to accept the request. It must not
	// contain the key header. A Host entry sets the request's Host.
	// Reports name the headers sent, never their values.
	Header http.Header

	// Body returns the body of the request for a variant: 0 for the
	// request that every check sends, 1 for the different request that the
	// key-mismatch check sends under a key already used for variant 0. Both
	// must be requests that the target accepts, and that it tells apart;
	// calls with the same variant must return equal bodies. BodyTemplate makes one from a
	// string. Nil means BodyTemplate(`{"idemtest_variant":{{variant}}}`),
	// sent as application/json unless Header names a Content-Type.
	Body func(variant int) []byte

	// SecondCredential, when set, makes a request as another caller: its
	// entries replace those of the same name in Header (an Authorization
	// header, an API key). It enables the cross-tenant check.
	SecondCredential http.Header

	// FailHeader, when set, is added to a request to make the target answer
	// it with a 5xx status, as a test hook in the target would. It enables
	// the 5xx-not-cached check. The target must not count these headers in
	// the request's fingerprint: the same request without them must be
	// the same request.
	FailHeader http.Header

	// KeysOptional says that the target runs requests that come without a
	// key, unprotected, so that the missing-key check does not apply. A
	// malformed key may then also be ignored, as RFC 8941 says of a field
	// that does not parse: the malformed-key check accepts a request that
	// runs as if it had no key, but not one whose malformed key is used as
	// a key.
	KeysOptional bool

	// KeyHeader is the request header that carries the key,
	// Idempotency-Key by default.
	KeyHeader string

	// KeyForm is how keys are written in the key header: KeyBare by
	// default, KeyQuoted, or KeyBoth for a target that accepts both forms.
	KeyForm KeyForm

	// MaxKeyLen, when set, is the longest key the target accepts, in
	// bytes: the malformed-key check then also sends a key one byte longer
	// and expects it refused. The draft sets no limit, so zero, the
	// default, sends no over-long key.
	//
	// The checks that need a valid key send keys of several lengths and
	// forms (12, 36, 64 and 255 bytes, and a key as stripe-go makes
	// them), those within MinKeyLen and MaxKeyLen: a target that takes
	// keys of one length only must declare it, as MinKeyLen and MaxKeyLen
	// both 36 declare a UUID's.
	MaxKeyLen int

	// MinKeyLen, when set, is the shortest key the target accepts, in
	// bytes: the malformed-key check then also sends a key one byte
	// shorter and expects it refused.
	MinKeyLen int

	// KeyAlphabet is the set of characters the target documents for its
	// keys: AlphabetASCII (printable ASCII, the draft's) by default,
	// AlphabetUTF8 (UTF-8 text) or AlphabetBytes (any byte but control
	// characters).
	KeyAlphabet KeyAlphabet

	// Require5xxRelease makes the release-5xx policy a requirement: after
	// a 5xx, a retry with the same key runs again, as it does behind this
	// module's server. The draft also lets a server store the error and
	// answer the retry with it, as Stripe does, so by default the
	// 5xx-not-cached check reports a stored 5xx as advisory.
	Require5xxRelease bool

	// ReplayedHeader is the response header that marks a replay,
	// Idempotent-Replayed by default. The kit also recognises the common
	// spellings Idempotency-Replayed, X-Idempotent-Replayed and
	// X-Idempotency-Replayed, and reports which one it saw. The values
	// "true", "1" and "?1" (a structured-field boolean) mark a replay.
	ReplayedHeader string

	// Concurrency is how many identical requests the concurrent check
	// sends at once, 10 by default. It must be at least 2.
	Concurrency int

	// Client sends the requests. Nil means a client of Check's own, which
	// does not follow redirects. Checks that need a connection of their
	// own dial the URL's host directly, with the TLS settings of the
	// Client's *http.Transport if it has one, and speak HTTP/1.1.
	Client *http.Client

	// Timeout bounds each request, 10 seconds by default.
	Timeout time.Duration

	// Patience bounds how long a check keeps asking while the target
	// answers 409 (the key in flight), 10 seconds by default.
	Patience time.Duration

	// DropAfter is how long the dropped-response check waits for an
	// answer before it closes the connection, 100ms by default: it plays a
	// client whose timeout fires then.
	DropAfter time.Duration

	// Checks names the checks to run, all of them when empty. See [Checks]
	// for the names. A check whose evidence comes from another (whether
	// the target takes the kit's keys, whether two executions answer
	// differently, whether replays are marked) runs that one first,
	// unreported, so that it judges alone as it does in a full run.
	Checks []string
}

// KeyForm is how the kit writes a key in the key header.
type KeyForm string

// The forms of a key on the wire.
const (
	// KeyBare sends the key as it is, the form most APIs take:
	// Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324.
	KeyBare KeyForm = "bare"
	// KeyQuoted sends the key as a Structured Field string (RFC 8941),
	// the form the IETF draft defines:
	// Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324".
	KeyQuoted KeyForm = "quoted"
	// KeyBoth is for a target that accepts both forms: keys are sent bare,
	// and the key-forms check sends each of two keys in both forms,
	// expecting the two forms of a key to be one key.
	KeyBoth KeyForm = "both"
)

// BodyTemplate returns a Body function that makes each variant from tmpl by
// replacing every {{variant}} with the variant's number, such as
// `{"sku":"A1","note":"{{variant}}"}`.
//
// A template without the placeholder is sent as it is for variant 0, and with
// n spaces appended for variant n. Trailing white space keeps a JSON document
// valid and changes its bytes, so a target that fingerprints the bytes of the
// body sees a different request; but a target that fingerprints the parsed
// document sees the same one, and then the key-mismatch check fails because of
// the template, not the target. Give such a target a placeholder.
func BodyTemplate(tmpl string) func(variant int) []byte {
	if strings.Contains(tmpl, placeholder) {
		return func(variant int) []byte {
			return []byte(strings.ReplaceAll(tmpl, placeholder, strconv.Itoa(variant)))
		}
	}
	return func(variant int) []byte {
		return append([]byte(tmpl), bytes.Repeat([]byte{' '}, max(variant, 0))...)
	}
}

// withDefaults returns t with its defaults filled in and its fields checked.
func (t Target) withDefaults() (Target, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("idemtest: "+format, args...))
	}
	switch {
	case t.URL == "" && t.Handler == nil:
		bad("Target needs a URL or a Handler")
	case t.URL != "" && t.Handler != nil:
		bad("Target has both a URL and a Handler")
	case t.URL != "":
		u, err := url.Parse(t.URL)
		switch {
		case err != nil:
			bad("Target.URL: %v", err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("Target.URL %q is not an http or https URL", t.URL)
		case u.Host == "":
			bad("Target.URL %q has no host", t.URL)
		case u.User != nil:
			bad("Target.URL has credentials in it: send them in Target.Header, which reports never show")
		}
	}
	if t.Path != "" && !strings.HasPrefix(t.Path, "/") && !strings.HasPrefix(t.Path, "?") {
		bad("Target.Path %q does not start with / or ?", t.Path)
	}
	if t.Method == "" {
		t.Method = defaultMethod
	}
	if !validToken(t.Method) { // a method is a token, as a header name is
		bad("Target.Method %q is not a valid method", t.Method)
	}
	if t.KeyHeader == "" {
		t.KeyHeader = headerKey
	}
	if t.ReplayedHeader == "" {
		t.ReplayedHeader = headerReplayed
	}
	switch t.KeyForm {
	case "":
		t.KeyForm = KeyBare
	case KeyBare, KeyQuoted, KeyBoth:
	default:
		bad("Target.KeyForm %q is not %q, %q or %q", t.KeyForm, KeyBare, KeyQuoted, KeyBoth)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"MaxKeyLen", t.MaxKeyLen}, {"MinKeyLen", t.MinKeyLen}} {
		if n.v < 0 {
			bad("Target.%s %d is negative", n.name, n.v)
		}
		if n.v > maxKeyProbe {
			bad("Target.%s %d is over %d: a longer key would be refused for the size of the header, not for its length", n.name, n.v, maxKeyProbe)
		}
	}
	if t.MaxKeyLen > 0 && t.MinKeyLen > t.MaxKeyLen {
		bad("Target.MinKeyLen %d is over Target.MaxKeyLen %d", t.MinKeyLen, t.MaxKeyLen)
	}
	switch t.KeyAlphabet {
	case "":
		t.KeyAlphabet = AlphabetASCII
	case AlphabetASCII, AlphabetUTF8, AlphabetBytes:
	default:
		bad("Target.KeyAlphabet %q is not %q, %q or %q", t.KeyAlphabet, AlphabetASCII, AlphabetUTF8, AlphabetBytes)
	}
	for _, name := range []string{t.KeyHeader, t.ReplayedHeader} {
		if !validToken(name) {
			bad("%q is not a valid header name", name)
		}
	}
	t.KeyHeader = http.CanonicalHeaderKey(t.KeyHeader)
	t.ReplayedHeader = http.CanonicalHeaderKey(t.ReplayedHeader)
	for _, h := range []struct {
		name   string
		header http.Header
	}{{"Header", t.Header}, {"SecondCredential", t.SecondCredential}, {"FailHeader", t.FailHeader}} {
		if err := checkHeader(h.header); err != nil {
			bad("Target.%s: %v", h.name, err)
		}
		if len(canonical(h.header)[t.KeyHeader]) > 0 {
			bad("Target.%s contains the key header %s; the checks set it", h.name, t.KeyHeader)
		}
	}
	t.Header = canonical(t.Header)
	t.SecondCredential = canonical(t.SecondCredential)
	t.FailHeader = canonical(t.FailHeader)
	if len(t.SecondCredential) > 0 && !changes(t.Header, t.SecondCredential) {
		bad("Target.SecondCredential is the same as Target.Header: the cross-tenant check needs another caller")
	}
	if t.Body == nil {
		t.Body = BodyTemplate(defaultBody)
		if t.Header.Get("Content-Type") == "" {
			t.Header.Set("Content-Type", "application/json")
		}
	}
	if t.Concurrency == 0 {
		t.Concurrency = defaultConcurrency
	}
	if t.Concurrency < 2 {
		bad("Target.Concurrency %d is less than 2", t.Concurrency)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Timeout", &t.Timeout, defaultTimeout},
		{"Patience", &t.Patience, defaultPatience},
		{"DropAfter", &t.DropAfter, defaultDropAfter},
	} {
		if *d.v < 0 {
			bad("Target.%s %v is negative", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	var all []string
	for _, c := range Checks() {
		all = append(all, c.Name)
	}
	for _, name := range t.Checks {
		if !slices.Contains(all, name) {
			bad("no check is named %q; the checks are %s", name, strings.Join(all, ", "))
		}
	}
	return t, errors.Join(errs...)
}

// canonical returns a copy of h with its names in canonical form, so that one
// header can replace another of the same name however either was spelled.
func canonical(h http.Header) http.Header {
	c := make(http.Header, len(h))
	for name, vs := range h {
		name = http.CanonicalHeaderKey(name)
		c[name] = append(c[name], vs...)
	}
	return c
}

// changes reports whether overlaying h with over changes any value.
func changes(h, over http.Header) bool {
	for name, vs := range over {
		if !slices.Equal(h[name], vs) {
			return true
		}
	}
	return false
}

func checkHeader(h http.Header) error {
	for name, values := range h {
		if !validToken(name) {
			return fmt.Errorf("%q is not a valid header name", name)
		}
		for _, v := range values {
			if !validValue(v) {
				return fmt.Errorf("header %s has an invalid value", name)
			}
		}
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token, as a method or a header
// name must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// validValue reports whether s may be sent as a header value: no control
// characters but horizontal tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
