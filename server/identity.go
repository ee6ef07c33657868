package server

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
)

// AuthorizationScope is the default scope function. It names the caller by a
// SHA-256 hash of the request's Authorization header, so that one tenant is
// never served another tenant's stored response, and so that the credential
// itself is never stored. Requests without the header share the empty scope.
//
// A hash of a low-entropy credential (a Basic password) can be guessed by
// whoever reads the store; an API that authenticates callers another way (a
// cookie, an API-key header) or knows its principal should use WithScope.
func AuthorizationScope(r *http.Request) (string, error) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return "", nil
	}
	h := sha256.New()
	io.WriteString(h, "idempotency scope v1\x00")
	io.WriteString(h, auth)
	var sum [sha256.Size]byte
	return "auth:" + hex.EncodeToString(h.Sum(sum[:0])[:16]), nil
}

// Fingerprint is the default fingerprint function: SHA-256 over the method,
// the escaped path, the raw query and the SHA-256 of the body, each
// length-prefixed so that no two different requests can be written the same
// way. The path is taken as the client escaped it, so that /items/a%2Fb and
// /items/a/b, which name different resources, never share a record.
func Fingerprint(r *http.Request, body []byte) (string, error) {
	bodySum := sha256.Sum256(body)
	var stack [256]byte
	b := append(stack[:0], "idempotency fingerprint v1"...)
	for _, s := range [...]string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	b = append(b, bodySum[:]...)
	sum := sha256.Sum256(b)
	return string(sum[:]), nil
}
