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

func FuzzParse(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "", `"`, `\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, err := Parse(s)
		if err != nil {
			return
		}
		if Validate(key) != nil {
			t.Fatalf("Parse(%q) = %q, which Validate refuses", s, key)
		}
		if got, err := Parse(Quote(key)); err != nil || got != key {
			t.Fatalf("Parse(Quote(%q)) = %q, %v", key, got, err)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`); err != nil {
			b.Fatal(err)
		}
	}
}
