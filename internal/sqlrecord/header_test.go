package sqlrecord

import (
	"net/http"
	"reflect"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []map[string][]string{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"X-Binary": {"\x00\x01\xff\xfe\"\\", ""}, "X-Order": {"z", "a", "m"}, "X-Empty": {}},
		{"": {""}, "X-Long": {string(make([]byte, 70000))}},
	} {
		got, err := DecodeHeader(EncodeHeader(h))
		if err != nil {
			t.Errorf("DecodeHeader(EncodeHeader(%q)) error = %v", h, err)
			continue
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("DecodeHeader(EncodeHeader(%q)) = %q", h, got)
		}
	}
}

func TestHeaderCorrupt(t *testing.T) {
	valid := EncodeHeader(http.Header{"A": {"b", "c"}})
	for name, b := range map[string][]byte{
		"empty":            {},
		"unknown version":  {2, 0},
		"truncated":        valid[:len(valid)-1],
		"trailing bytes":   append(append([]byte{}, valid...), 0),
		"huge count":       {1, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"overlong string":  {1, 1, 5, 'a'},
		"unfinished count": {1, 0x80},
		"unsorted names":   {1, 2, 1, 'b', 0, 1, 'a', 0},
		"repeated name":    {1, 2, 1, 'a', 0, 1, 'a', 0},
	} {
		if h, err := DecodeHeader(b); err == nil {
			t.Errorf("DecodeHeader(%s) = %q, want an error", name, h)
		}
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(EncodeHeader(http.Header{"A": {"b", "c"}, "D": {""}}))
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		again, err := DecodeHeader(EncodeHeader(h))
		if err != nil || !reflect.DeepEqual(again, h) {
			t.Errorf("DecodeHeader(%x) = %q, which re-encodes to %q, %v", b, h, again, err)
		}
	})
}
