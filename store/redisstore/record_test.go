package redisstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/idemkit/idempotency/engine"
)

// sampleRecords returns valid records of every version in every state.
func sampleRecords() []record {
	const token = engine.Token(1796000000000000)
	return []record{
		{version: recordVersion, state: stateInFlight, token: token, nonce: 7, slack: 3_540_000, fingerprint: "fp\x00\xff"},
		{version: recordVersion, state: stateInFlight, token: 1, fingerprint: ""},
		{version: recordVersion, state: stateInFlight, token: 2, abandoned: 3, created: 1796000000000, fingerprint: "fp"},
		{version: v2Version, state: stateInFlight, token: token, nonce: 7, slack: 60_000, fingerprint: "fp"},
		{version: v2Version, state: stateReleased, token: token, nonce: 2},
		{version: v2Version, state: stateCompleted, token: token, nonce: 9, fingerprint: "fp",
			response: &engine.Response{Status: http.StatusCreated, Header: http.Header{"A": {"b"}}, Body: []byte("x")}},
		{version: recordVersion, state: stateReleased, token: token, nonce: 1 << 63},
		{version: recordVersion, state: stateCompleted, token: token, nonce: 9, fingerprint: "fp",
			response: &engine.Response{Status: http.StatusNoContent}},
		{version: recordVersion, state: stateCompleted, token: token, fingerprint: string(make([]byte, 32)),
			response: &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/x"}}, BodyOmitted: true}},
		{version: recordVersion, state: stateCompleted, token: token, nonce: 3, fingerprint: "fp", response: &engine.Response{
			Status: 299,
			Header: http.Header{
				"X-Binary": {"\x00\x01\xff", ""},
				"X-Order":  {"z", "a", "m"},
				"X-Empty":  {},
				"":         {"empty name"},
			},
			Body: bytes.Repeat([]byte{0, 0xff, '\n'}, 300),
		}},
		{version: legacyVersion, state: stateInFlight, token: token, leaseEnd: 1796000060000000, nonce: 5, fingerprint: "fp"},
		{version: legacyVersion, state: stateReleased, token: token, nonce: 6},
		{version: legacyVersion, state: stateCompleted, token: token, nonce: 8, fingerprint: "fp", response: &engine.Response{
			Status: http.StatusOK, Header: http.Header{"A": {"b", "c"}, "Content-Type": {"text/plain"}}, Body: []byte("body"),
		}},
		// In flight with steps, after the release of the holder that
		// created it: abandoned -1.
		{version: recordVersion, state: stateSteps, token: token, nonce: 4, slack: 0, abandoned: 1<<32 - 1, created: 1796000000000, fingerprint: "fp"},
		{version: recordVersion, state: stateSteps, token: token, nonce: 4, slack: 60_000, abandoned: 2, created: 1796000000000, fingerprint: "fp"},
	}
}

func mustEncode(t testing.TB, r record) []byte {
	t.Helper()
	b, err := encodeRecord(r)
	if err != nil {
		t.Fatalf("encodeRecord(%+v) error = %v", r, err)
	}
	return b
}

// sameRecord describes how got differs from want, or returns "". A nil and
// an empty header, body or value list are the same.
func sameRecord(got, want record) string {
	gr, wr := got.response, want.response
	got.response, want.response = nil, nil
	if got != want {
		return fmt.Sprintf("record %+v, want %+v", got, want)
	}
	if (gr == nil) != (wr == nil) {
		return fmt.Sprintf("response %+v, want %+v", gr, wr)
	}
	if gr == nil {
		return ""
	}
	if gr.Status != wr.Status || gr.BodyOmitted != wr.BodyOmitted || !bytes.Equal(gr.Body, wr.Body) {
		return fmt.Sprintf("response %d %v %d bytes, want %d %v %d bytes",
			gr.Status, gr.BodyOmitted, len(gr.Body), wr.Status, wr.BodyOmitted, len(wr.Body))
	}
	if len(gr.Header) != len(wr.Header) {
		return fmt.Sprintf("%d headers, want %d", len(gr.Header), len(wr.Header))
	}
	for k, vs := range wr.Header {
		if g, ok := gr.Header[k]; !ok || !slices.Equal(g, vs) {
			return fmt.Sprintf("header %q = %q, want %q", k, g, vs)
		}
	}
	return ""
}

func TestRecordRoundTrip(t *testing.T) {
	for i, want := range sampleRecords() {
		enc := mustEncode(t, want)
		got, err := decodeRecord(string(enc))
		if err != nil {
			t.Fatalf("record %d: decodeRecord error = %v", i, err)
		}
		if diff := sameRecord(got, want); diff != "" {
			t.Errorf("record %d: decoded %s", i, diff)
		}
		if again := mustEncode(t, got); !bytes.Equal(again, enc) {
			t.Errorf("record %d: re-encoded to %q, want %q", i, again, enc)
		}
	}
}

// What the functions compare byte for byte is what decodeRecord reads.
func TestHeadLayout(t *testing.T) {
	rec := mustEncode(t, record{version: recordVersion, state: stateInFlight, token: 12345, nonce: 99, slack: 77, fingerprint: "fp"})
	if got := heldBy(12345); !bytes.Equal(got, rec[:10]) {
		t.Errorf("heldBy = %q, want the record's first 10 bytes %q", got, rec[:10])
	}
	if got := appendHead(nil, recordVersion, stateInFlight, 12345, 99, 77); !bytes.Equal(got, rec[:26]) {
		t.Errorf("appendHead = %q, want the record's first 26 bytes %q", got, rec[:26])
	}
}

// Values share a backing array: appending to one must not change another.
func TestDecodedValuesDoNotShare(t *testing.T) {
	want := sampleRecords()[9]
	got, err := decodeRecord(string(mustEncode(t, want)))
	if err != nil {
		t.Fatal(err)
	}
	for k := range got.response.Header {
		got.response.Header[k] = append(got.response.Header[k], "appended")
	}
	for k, vs := range want.response.Header {
		if g := got.response.Header[k]; !slices.Equal(g[:len(g)-1], vs) {
			t.Errorf("after appending, header %q = %q, want %q and the appended value", k, g, vs)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, r := range []record{
		{version: recordVersion, state: stateCompleted, response: &engine.Response{Status: -1}},
		{version: recordVersion, state: stateCompleted, response: &engine.Response{Status: 1 << 16}},
		{version: recordVersion, state: stateCompleted},
		{version: recordVersion, state: stateInFlight, response: &engine.Response{Status: 200}},
		{version: 4, state: stateInFlight},
	} {
		if _, err := encodeRecord(r); err == nil {
			t.Errorf("encodeRecord(%+v) error = nil, want an error", r)
		}
	}
	if _, err := encodeResponse(nil); err == nil {
		t.Error("encodeResponse(nil) error = nil, want an error")
	}
}

// checkDecoded checks what decodeRecord makes of rec: ErrCorruptRecord, or a
// record that encodes back to rec (versions 2 and 3) or to a record that decodes
// the same and encodes to itself (version 1, whose header names were in no
// order).
func checkDecoded(t *testing.T, rec string) {
	t.Helper()
	r, err := decodeRecord(rec)
	if err != nil {
		if !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("decodeRecord(%q) error = %v, want ErrCorruptRecord", rec, err)
		}
		return
	}
	enc, err := encodeRecord(r)
	if err != nil {
		t.Fatalf("encodeRecord of the decoded %q error = %v", rec, err)
	}
	if r.version != legacyVersion && string(enc) != rec {
		t.Fatalf("decodeRecord(%q) re-encodes to %q", rec, enc)
	}
	r2, err := decodeRecord(string(enc))
	if err != nil {
		t.Fatalf("decodeRecord of the re-encoded %q error = %v", enc, err)
	}
	if diff := sameRecord(r2, r); diff != "" {
		t.Fatalf("re-encoded %q decodes to %s", rec, diff)
	}
	if enc2 := mustEncode(t, r2); !bytes.Equal(enc2, enc) {
		t.Fatalf("re-encoding is not stable: %q, then %q", enc, enc2)
	}
}

// Every prefix of a record is refused as corrupt; every single-byte change
// is refused or decodes to a record that re-encodes to it.
func TestDecodeDamagedRecords(t *testing.T) {
	for _, r := range sampleRecords() {
		rec := string(mustEncode(t, r))
		for n := range len(rec) {
			if _, err := decodeRecord(rec[:n]); !errors.Is(err, ErrCorruptRecord) {
				t.Errorf("decodeRecord of the first %d of %d bytes error = %v, want ErrCorruptRecord", n, len(rec), err)
			}
		}
		for i := range min(len(rec), 200) {
			for _, c := range []byte{0, 1, 2, 3, 0x7f, 0x80, 0xff} {
				b := []byte(rec)
				b[i] = c
				checkDecoded(t, string(b))
			}
		}
		checkDecoded(t, rec+"x")
	}
}

// The response's encoding has one form: names in increasing order (versions
// 2 and 3), no duplicates, varints in their shortest form.
func TestDecodeRefusesOtherForms(t *testing.T) {
	head := func(version byte) []byte {
		b := []byte{version, stateCompleted}
		b = binary.BigEndian.AppendUint64(b, 1)
		b = binary.BigEndian.AppendUint64(b, 0)
		b = binary.BigEndian.AppendUint64(b, 0)
		b = binary.BigEndian.AppendUint32(b, 0) // no fingerprint
		if version == recordVersion {
			b = append(b, make([]byte, recordHeader-oldHeader)...)
		}
		return b
	}
	// Status 200, no flags, no body; then the header's encoding.
	fixed := []byte{0, 200, 0, 0, 0, 0, 0}
	unsorted := []byte{2, 2, 1, 'b', 1, 1, 'x', 1, 'a', 1, 1, 'y'}
	for _, tc := range []struct {
		name    string
		version byte
		header  []byte
		ok      bool
	}{
		{"sorted", recordVersion, []byte{2, 2, 1, 'a', 1, 1, 'y', 1, 'b', 1, 1, 'x'}, true},
		{"unsorted", recordVersion, unsorted, false},
		{"unsorted, version 2", v2Version, unsorted, false},
		{"unsorted, version 1", legacyVersion, unsorted, true},
		{"duplicate", recordVersion, []byte{2, 2, 1, 'a', 1, 1, 'y', 1, 'a', 1, 1, 'x'}, false},
		{"duplicate, version 1", legacyVersion, []byte{2, 2, 1, 'a', 1, 1, 'y', 1, 'a', 1, 1, 'x'}, false},
		{"overlong count", recordVersion, []byte{0x81, 0, 1, 1, 'a', 1, 1, 'y'}, false},
		{"overlong length", recordVersion, []byte{1, 1, 0x81, 0, 'a', 1, 1, 'y'}, false},
		{"overlong zero", recordVersion, []byte{0x80, 0, 0}, false},
		{"values miscounted", recordVersion, []byte{1, 2, 1, 'a', 1, 1, 'y'}, false},
		{"trailing bytes", recordVersion, []byte{1, 1, 1, 'a', 1, 1, 'y', 0}, false},
	} {
		rec := string(append(append(head(tc.version), fixed...), tc.header...))
		_, err := decodeRecord(rec)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: decodeRecord error = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// FuzzDecodeRecord checks decodeRecord, the decoding that happens in Go:
// arbitrary bytes never panic, and either fail with ErrCorruptRecord or
// decode to a record that re-encodes canonically (to the same bytes, for
// version 2), and whose encoding decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(string(mustEncode(f, r)))
	}
	f.Fuzz(checkDecoded)
}

// FuzzRecordRoundTrip checks that every valid record built from arbitrary
// fields decodes to itself.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(uint8(0), int64(1796000000000000), uint64(7), int64(60000), "fp", uint16(201), false, "Location", "/orders/1", "X-Two", "b", []byte(`{"id":1}`))
	f.Add(uint8(1), int64(1), uint64(0), int64(0), "", uint16(0), true, "", "", "", "", []byte(nil))
	f.Add(uint8(5), int64(-1), uint64(1<<63), int64(-5), "\x00\xff", uint16(65535), false, "a", "\x00", "a", "\xff", []byte{0})
	f.Fuzz(func(t *testing.T, kind uint8, token int64, nonce uint64, n int64, fp string, status uint16, omitted bool,
		name1, value1, name2, value2 string, body []byte) {
		want := record{token: engine.Token(token), nonce: nonce, fingerprint: fp}
		want.version = []byte{recordVersion, legacyVersion, v2Version}[kind%3]
		want.state = stateInFlight + kind/3%4
		if want.state == stateSteps && want.version != recordVersion {
			want.state = stateInFlight
		}
		switch want.version {
		case legacyVersion:
			want.leaseEnd = n
		case recordVersion:
			want.abandoned, want.created = uint32(nonce), n
			fallthrough
		default:
			want.slack = n
		}
		if want.state == stateCompleted {
			h := http.Header{}
			h[name1] = append(h[name1], value1)
			h[name2] = append(h[name2], value2, value1)
			want.response = &engine.Response{Status: int(status), Header: h, Body: body, BodyOmitted: omitted}
		}
		enc := mustEncode(t, want)
		got, err := decodeRecord(string(enc))
		if err != nil {
			t.Fatalf("decodeRecord of %q error = %v", enc, err)
		}
		if diff := sameRecord(got, want); diff != "" {
			t.Fatalf("decoded %s", diff)
		}
	})
}

func TestRecordKey(t *testing.T) {
	for _, tc := range []struct {
		id   engine.ID
		want string
	}{
		{engine.ID{}, "p:0::"},
		{engine.ID{Scope: "a:b", Key: "c"}, "p:3:a:b:c"},
		{engine.ID{Scope: "a", Key: "b:c"}, "p:1:a:b:c"},
		{engine.ID{Scope: "tenant-0123456789", Key: "k"}, "p:17:tenant-0123456789:k"},
	} {
		if got := recordKey("p:", tc.id); got != tc.want {
			t.Errorf("recordKey(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}
