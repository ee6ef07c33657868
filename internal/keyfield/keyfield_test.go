package keyfield

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, in, want string
		err            error
	}{
		{"uuid", "8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"quoted", `"8e03978e-40d5-43e8"`, "8e03978e-40d5-43e8", nil},
		{"quoted escapes", `"a\"b\\c"`, `a"b\c`, nil},
		{"inner space", "a b", "a b", nil},
		{"max length", strings.Repeat("k", 255), strings.Repeat("k", 255), nil},
		{"quoted max length", `"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), nil},
		{"empty", "", "", ErrEmpty},
		{"quoted empty", `""`, "", ErrEmpty},
		{"too long", strings.Repeat("k", 256), "", ErrTooLong},
		{"newline", "a\nb", "", ErrCharacter},
		{"nul", "a\x00b", "", ErrCharacter},
		{"del", "a\x7fb", "", ErrCharacter},
		{"non-ascii", "café", "", ErrCharacter},
		{"tab", "a\tb", "", ErrCharacter},
		{"leading space", " a", "", ErrSpace},
		{"unterminated", `"abc`, "", ErrQuoting},
		{"trailing text", `"abc"d`, "", ErrQuoting},
		{"bad escape", `"a\nb"`, "", ErrQuoting},
		{"lone backslash at end", `"abc\`, "", ErrQuoting},
		{"quoted control", "\"a\x01b\"", "", ErrCharacter},
		{"lone quote", `"`, "", ErrQuoting},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if !errors.Is(err, tt.err) {
				t.Fatalf("Parse(%q) error = %v, want %v", tt.in, err, tt.err)
			}
			if err == nil && got != tt.want {
				t.Fatalf("Parse(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestQuoteRoundTrip(t *testing.T) {
	for _, key := range []string{"abc", `a"b`, `a\b`, `\"\\`, "8e03978e-40d5-43e8-bc93-6894a57f9324"} {
		q := Quote(key)
		got, err := Parse(q)
		if err != nil || got != key {
			t.Errorf("Parse(Quote(%q)) = %q, %v; want %q, nil", key, got, err, key)
		}
	}
}

// FuzzParse checks Parse against a plain reading of the two wire forms (a
// bare key, or an RFC 8941 sf-string) and checks that what it accepts round
// trips through Quote.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"abc", `"abc"`, `"a\"b"`, `"a\\b"`, "", `"`, `\`, `""`, `" a"`, `"a "`, " a", "a ",
		"8e03978e-40d5-43e8-bc93-6894a57f9324", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		`"abc"d`, `"abc`, `"a\nb"`, `"abc\`, "a\x00b", "caf\u00e9", `a"b`, `"a"b"`,
		strings.Repeat("k", MaxLen), strings.Repeat("k", MaxLen+1),
		`"` + strings.Repeat("k", MaxLen) + `"`, `"` + strings.Repeat(`\"`, MaxLen) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := Parse(s)
		want, ok := referenceParse(s)
		if (err == nil) != ok {
			t.Fatalf("Parse(%q) error = %v, want ok = %v", s, err, ok)
		}
		if err != nil {
			return
		}
		if key != want {
			t.Fatalf("Parse(%q) = %q, want %q", s, key, want)
		}
		if Validate(key) != nil {
			t.Fatalf("Parse(%q) = %q, which Validate refuses", s, key)
		}
		if len(key) > MaxLen {
			t.Fatalf("Parse(%q) = %d bytes, over %d", s, len(key), MaxLen)
		}
		q := Quote(key)
		if got, err := Parse(q); err != nil || got != key {
			t.Fatalf("Parse(Quote(%q)) = %q, %v; want the key", key, got, err)
		}
		if s[0] == '"' && q != s {
			// Escapes are only for " and \, so the quoted form is unique.
			t.Fatalf("Quote(Parse(%q)) = %q, want the input back", s, q)
		}
		if s[0] != '"' && key != s {
			t.Fatalf("Parse(%q) = %q, want a bare key unchanged", s, key)
		}
	})
}

// FuzzQuote checks that every valid key comes back from its quoted form,
// and that the quoted form is an sf-string.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"abc", `a"b`, `a\b`, `\"\\`, `"`, `""`, " ", "a b", strings.Repeat(`"`, MaxLen)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if Validate(key) != nil {
			return
		}
		q := Quote(key)
		got, ok := referenceParse(q)
		if !ok || got != key {
			t.Fatalf("Quote(%q) = %s, which reads as %q, %v", key, q, got, ok)
		}
		if got, err := Parse(q); err != nil || got != key {
			t.Fatalf("Parse(Quote(%q)) = %q, %v; want the key", key, got, err)
		}
		if n := strings.Count(key, `"`) + strings.Count(key, `\`); len(q) != len(key)+2+n {
			t.Fatalf("Quote(%q) = %d bytes, want %d", key, len(q), len(key)+2+n)
		}
	})
}

// referenceParse is Parse written from the rules, one character at a time,
// without regard for speed.
func referenceParse(s string) (string, bool) {
	key := s
	if strings.HasPrefix(s, `"`) {
		// RFC 8941, section 4.2.5: Parsing a String.
		var b []byte
		i, closed := 1, false
		for i < len(s) && !closed {
			c := s[i]
			i++
			switch {
			case c == '\\':
				if i == len(s) || (s[i] != '"' && s[i] != '\\') {
					return "", false
				}
				b = append(b, s[i])
				i++
			case c == '"':
				closed = true
			case c < 0x20 || c > 0x7e:
				return "", false
			default:
				b = append(b, c)
			}
		}
		if !closed || i != len(s) {
			return "", false
		}
		key = string(b)
	}
	if len(key) < 1 || len(key) > 255 || key[0] == ' ' || key[len(key)-1] == ' ' {
		return "", false
	}
	for _, r := range []byte(key) {
		if r < 0x20 || r > 0x7e {
			return "", false
		}
	}
	return key, true
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`); err != nil {
			b.Fatal(err)
		}
	}
}
