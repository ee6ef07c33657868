package server

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"reflect"
	"strconv"
	"strings"
)

// credentialHeaders are the request headers that carry a caller's
// credential in the APIs people run, in canonical form: the standard two,
// then the API-key headers of API gateways and hosted APIs.
var credentialHeaders = [...]string{
	"Authorization",
	"Proxy-Authorization",
	"X-Api-Key",                 // AWS API Gateway, many APIs
	"Api-Key",                   // Azure OpenAI, Azure Cognitive Search
	"X-Auth-Token",              // OpenStack, Docker registries
	"X-Access-Token",            // a common form of a bearer token
	"X-Goog-Api-Key",            // Google APIs
	"Ocp-Apim-Subscription-Key", // Azure API Management
	"Private-Token",             // GitLab
}

// CredentialScope is the default scope function. It names the caller by a
// SHA-256 hash of the request's credential headers (Authorization,
// Proxy-Authorization and the common API-key headers: X-Api-Key, Api-Key,
// X-Auth-Token, X-Access-Token, X-Goog-Api-Key, Ocp-Apim-Subscription-Key,
// Private-Token), so that one tenant is never served another
// tenant's stored response, and so that no credential is ever stored.
// Cookies are left out: a request and its retry often carry different ones.
// Requests without any of those headers share the empty scope.
//
// A hash of a low-entropy credential (a Basic password) can be guessed by
// whoever reads the store; an API that authenticates callers another way (a
// session cookie, a client certificate) or knows its principal should use
// [WithScope]. So should one whose clients send bearer tokens (OAuth): a
// token refreshed between a request whose answer was lost and its retry
// puts the retry in another scope, where it runs again; the first request
// scoped by a bearer token is logged at warn level.
func CredentialScope(r *http.Request) (string, error) {
	// Most credentials fit on the stack; a long one (a JWT) spills once.
	var stack [512]byte
	b := append(stack[:0], "idempotency scope v2"...)
	found := false
	for _, name := range credentialHeaders {
		values := r.Header[name]
		if len(values) == 0 || len(values) == 1 && values[0] == "" {
			continue
		}
		found = true
		// The name, the number of values, and each value
		// length-prefixed: no two sets of headers are written the same.
		b = appendString(b, name)
		b = binary.BigEndian.AppendUint64(b, uint64(len(values)))
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	if !found {
		return "", nil
	}
	sum := sha256.Sum256(b)
	return "cred:" + hex.EncodeToString(sum[:16]), nil
}

// bearerHeader returns the name of the credential header of h that holds
// a bearer token (RFC 6750: the Bearer scheme of Authorization, or of
// Proxy-Authorization), or "". A bearer token is refreshed as it nears its
// expiry, so that a retry may carry another one than the request it
// repeats, and under CredentialScope be in another scope.
func bearerHeader(h http.Header) string {
	for _, name := range [...]string{"Authorization", "Proxy-Authorization"} {
		for _, v := range h[name] {
			if len(v) > len("Bearer ") && strings.EqualFold(v[:len("Bearer ")], "Bearer ") {
				return name
			}
		}
	}
	return ""
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// Fingerprint is the default fingerprint function: SHA-256 over the method,
// the escaped path, the raw query and the SHA-256 of the body, each
// length-prefixed so that no two different requests can be written the same
// way. The path is taken as the client escaped it, so that /items/a%2Fb and
// /items/a/b, which name different resources, never share a record.
func Fingerprint(r *http.Request, body []byte) (string, error) {
	var sum [sha256.Size]byte
	fingerprint(&sum, r, body)
	return string(sum[:]), nil
}

// fingerprint writes Fingerprint's value into sum.
func fingerprint(sum *[sha256.Size]byte, r *http.Request, body []byte) {
	bodySum := sha256.Sum256(body)
	var stack [256]byte
	b := append(stack[:0], "idempotency fingerprint v1"...)
	for _, s := range [...]string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	b = append(b, bodySum[:]...)
	*sum = sha256.Sum256(b)
}

// isFingerprint reports whether fn is Fingerprint, whose value the
// middleware then computes in place.
func isFingerprint(fn func(*http.Request, []byte) (string, error)) bool {
	return reflect.ValueOf(fn).Pointer() == reflect.ValueOf(Fingerprint).Pointer()
}
