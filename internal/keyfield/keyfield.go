// Package keyfield validates, parses and formats the value of the
// Idempotency-Key header, shared by the client and the server so that both
// sides agree on what a well-formed key is.
//
// A key is 1 to 255 bytes of printable ASCII (0x20 to 0x7E) that neither
// starts nor ends with a space. On the wire it is sent either as a bare token
// (the form most APIs use) or as a Structured Field string (RFC 8941, the form
// the IETF Idempotency-Key draft specifies): "...", with \" and \\ escapes.
// Both forms name the same key.
package keyfield

import (
	"errors"
	"strings"
)

// MaxLen is the largest key, in bytes, after any structured-field unquoting.
const MaxLen = 255

// Errors returned by Validate and Parse. They describe what is wrong; callers
// wrap them in their own package's sentinel.
var (
	ErrEmpty     = errors.New("key is empty")
	ErrTooLong   = errors.New("key is longer than 255 bytes")
	ErrCharacter = errors.New("key contains a character outside printable ASCII")
	ErrSpace     = errors.New("key starts or ends with a space")
	ErrQuoting   = errors.New("key is a malformed structured-field string")
)

// Validate reports whether key is acceptable as an idempotency key.
func Validate(key string) error {
	if key == "" {
		return ErrEmpty
	}
	if len(key) > MaxLen {
		return ErrTooLong
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return ErrCharacter
		}
	}
	if key[0] == ' ' || key[len(key)-1] == ' ' {
		return ErrSpace
	}
	return nil
}

// Parse returns the key carried by a header value in either wire form and
// checks it with Validate. It does not allocate unless the quoted form
// contains escapes.
func Parse(value string) (string, error) {
	if len(value) == 0 || value[0] != '"' {
		return value, Validate(value)
	}
	key, err := unquote(value)
	if err != nil {
		return "", err
	}
	return key, Validate(key)
}

func unquote(value string) (string, error) {
	// value[0] is the opening quote.
	end := -1
	escapes := false
	for i := 1; i < len(value); i++ {
		switch c := value[i]; {
		case c == '\\':
			if i+1 >= len(value) || (value[i+1] != '"' && value[i+1] != '\\') {
				return "", ErrQuoting
			}
			escapes = true
			i++
		case c == '"':
			end = i
		case c < 0x20 || c > 0x7e:
			return "", ErrCharacter
		}
		if end >= 0 {
			break
		}
	}
	if end < 0 || end != len(value)-1 {
		return "", ErrQuoting
	}
	inner := value[1:end]
	if !escapes {
		return inner, nil
	}
	var b strings.Builder
	b.Grow(len(inner))
	for i := 0; i < len(inner); i++ {
		if inner[i] == '\\' {
			i++
		}
		b.WriteByte(inner[i])
	}
	return b.String(), nil
}

// Quote returns key as a Structured Field string. key must be valid.
func Quote(key string) string {
	if !strings.ContainsAny(key, `"\`) {
		return `"` + key + `"`
	}
	var b strings.Builder
	b.Grow(len(key) + 4)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
