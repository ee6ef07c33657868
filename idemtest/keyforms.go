package idemtest

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// keyForm is one shape of valid key that the kit sends: the checks that
// need a valid key use every form the target's declared lengths and
// alphabet allow, so that a target that takes only keys of one length or
// form is seen doing so.
type keyForm struct {
	name string        // "the 64-byte key", for reports
	make func() string // a fresh random key of this form
}

// The lengths of the kit's own key forms.
const (
	shortKeyLen = 12
	uuidKeyLen  = 36
	hexKeyLen   = 64
	longKeyLen  = 255
)

// keyForms returns the forms of valid key for the policy p: a short key, a UUID, a
// 64-character hex key (a SHA-256 digest), a 255-byte key (the longest
// that common APIs accept) and a key as stripe-go makes them, and a key
// with a non-ASCII character for the "utf8" and "bytes" alphabets, and one
// with bytes that are not UTF-8 for "bytes"; each kept only if its
// length is within the declared bounds. The UUID comes first: it is the
// form that most clients send. When none fits the bounds, a key of the
// shortest declared length is the one form.
func keyForms(p Policy) []keyForm {
	all := []keyForm{
		{fmt.Sprintf("the %d-byte UUID key", uuidKeyLen), newKey},
		{fmt.Sprintf("the %d-byte key", shortKeyLen), func() string { return randomHex(shortKeyLen) }},
		{fmt.Sprintf("the %d-byte hex key", hexKeyLen), func() string { return randomHex(hexKeyLen) }},
		{fmt.Sprintf("the %d-byte key", longKeyLen), func() string { return randomHex(longKeyLen) }},
		{"the stripe-go style key", stripeKey},
	}
	if p.KeyAlphabet == alphabetUTF8 || p.KeyAlphabet == alphabetBytes {
		all = append(all, keyForm{"the key with non-ASCII characters", func() string { return "clé-" + newKey() + "-ünï" }})
	}
	if p.KeyAlphabet == alphabetBytes {
		// Latin-1, as a client that writes ISO 8859-1 sends it.
		all = append(all, keyForm{"the key with bytes that are not UTF-8", func() string { return "cl\xe9-" + newKey() + "-\xfcn\xef" }})
	}
	var forms []keyForm
	for _, f := range all {
		if n := len(f.make()); p.allowsLen(n) {
			forms = append(forms, f)
		}
	}
	if len(forms) == 0 {
		n := max(p.MinKeyLen, 1)
		forms = append(forms, keyForm{fmt.Sprintf("the %d-byte key", n), func() string { return randomHex(n) }})
	}
	return forms
}

// allowsLen reports whether a key of n bytes is within the declared
// bounds.
func (p Policy) allowsLen(n int) bool {
	return n >= p.MinKeyLen && (p.MaxKeyLen == 0 || n <= p.MaxKeyLen)
}

// probeLen is the length of the malformed keys: a valid length, the UUID's
// where the bounds allow it, so that a target refuses them for what they
// contain rather than for their length; at least 3, so that a character
// can stand inside the key.
func (p Policy) probeLen() int {
	n := uuidKeyLen
	if n < p.MinKeyLen {
		n = p.MinKeyLen
	}
	if p.MaxKeyLen > 0 && n > p.MaxKeyLen {
		n = p.MaxKeyLen
	}
	return max(n, 3)
}

// randomHex returns n random hexadecimal characters.
func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	rand.Read(b) // never fails; see its documentation
	return hex.EncodeToString(b)[:n]
}

// stripeKey returns a key as stripe-go's NewIdempotencyKey makes them: the
// time in nanoseconds, an underscore and six characters of URL-safe base64,
// such as 1764547200123456789_q0Zs-A.
func stripeKey() string {
	var b [6]byte
	rand.Read(b[:])
	return strconv.FormatInt(time.Now().UnixNano(), 10) + "_" + base64.URLEncoding.EncodeToString(b[:])[:6]
}

// newKey returns a fresh random key in the form of a version 4 UUID.
func newKey() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [uuidKeyLen]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// keyed returns the request for variant with a fresh key, of the next of
// the forms that the first-request check saw succeed, in turn, so that the
// checks between them send every form.
func (r *runner) keyed(variant int) request {
	forms := r.working
	if len(forms) == 0 {
		forms = r.forms
	}
	f := forms[r.turn%len(forms)]
	r.turn++
	q := r.withKey(variant, f.make())
	q.form = f.name
	return q
}

// describeKeyLimits says what the target declared of its keys, for a hint
// in a report.
func describeKeyLimits(p Policy) string {
	var parts []string
	switch {
	case p.MinKeyLen > 0 && p.MinKeyLen == p.MaxKeyLen:
		parts = append(parts, fmt.Sprintf("keys of exactly %d bytes", p.MinKeyLen))
	case p.MinKeyLen > 0 && p.MaxKeyLen > 0:
		parts = append(parts, fmt.Sprintf("keys of %d to %d bytes", p.MinKeyLen, p.MaxKeyLen))
	case p.MinKeyLen > 0:
		parts = append(parts, fmt.Sprintf("keys of at least %d bytes", p.MinKeyLen))
	case p.MaxKeyLen > 0:
		parts = append(parts, fmt.Sprintf("keys of at most %d bytes", p.MaxKeyLen))
	}
	switch p.KeyAlphabet {
	case alphabetUTF8:
		parts = append(parts, "UTF-8 keys")
	case alphabetBytes:
		parts = append(parts, "keys of any bytes but control characters")
	}
	return strings.Join(parts, ", ")
}
