package jsoncodec

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJSONCodec: the default codec refuses a string that is not UTF-8
// wherever it is, names where, and encodes the rest as encoding/json does.
func TestJSONCodec(t *testing.T) {
	type inner struct{ Name string }
	type outer struct {
		Inner  inner
		List   []inner
		Hidden string `json:"-"`
		secret string
	}
	for _, tc := range []struct {
		v    any
		path string
	}{
		{"\xff", "the string is not valid UTF-8"},
		{outer{Inner: inner{Name: "\xff"}}, ".Inner.Name"},
		{outer{List: []inner{{}, {Name: "\xfe"}}}, ".List[1].Name"},
		{map[string]int{"a\xff": 1}, "the string at [a key]"},
		{map[string]string{"a": "\xff"}, `["a"]`},
	} {
		_, err := Codec{}.Marshal(tc.v)
		assert.ErrorIs(t, err, errInvalidUTF8, "%#v", tc.v)
		assert.ErrorContains(t, err, tc.path)
	}
	b, err := Codec{}.Marshal(outer{Hidden: "\xff", secret: "\xff", List: []inner{{Name: "é"}}})
	require.NoError(t, err, "fields JSON leaves out are not checked")
	assert.JSONEq(t, `{"Inner":{"Name":""},"List":[{"Name":"é"}]}`, string(b))

	// Deep is not a cycle: the string at the end of a long list is
	// checked.
	type node struct {
		Name string
		Next *node
	}
	list := &node{Name: "\xff"}
	for range 300 {
		list = &node{Name: "ok", Next: list}
	}
	_, err = Codec{}.Marshal(list)
	assert.ErrorIs(t, err, errInvalidUTF8)

	// A cycle is encoding/json's to report, not a reason to loop.
	cycle := map[string]any{}
	cycle["self"] = cycle
	_, err = Codec{}.Marshal(cycle)
	assert.Error(t, err)
	assert.NotErrorIs(t, err, errInvalidUTF8)
}

// TestJSONCodecReplacementLookalikes: U+FFFD itself, and text that reads
// like its escape, are valid UTF-8 and encoded as they are, though they make
// Marshal check the strings; a TextMarshaler's text is checked too.
func TestJSONCodecReplacementLookalikes(t *testing.T) {
	for _, v := range []any{"\uFFFD", `\ufffd`, map[string]string{"\uFFFD": `a\ufffd`}} {
		b, err := Codec{}.Marshal(v)
		require.NoError(t, err, "%q", v)
		want, err := json.Marshal(v)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(b))
	}
	_, err := Codec{}.Marshal(struct{ T badText }{})
	assert.ErrorIs(t, err, errInvalidUTF8, "a TextMarshaler's text that is not UTF-8")
	_, err = Codec{}.Marshal(map[badText]int{{}: 1})
	assert.ErrorIs(t, err, errInvalidUTF8, "a map key's text that is not UTF-8")
}

// badText marshals to text that is not UTF-8.
type badText struct{}

func (badText) MarshalText() ([]byte, error) { return []byte("a\xffb"), nil }
