package redisstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/idemkit/idempotency/server"
)

// completedRecord builds a completed record as the scripts write it.
func completedRecord(t testing.TB, fp string, resp *server.Response) string {
	t.Helper()
	enc, err := encodeResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{recordVersion, stateCompleted}
	b = binary.BigEndian.AppendUint64(b, 1796000000000000) // token
	b = binary.BigEndian.AppendUint64(b, 0)                // lease end
	b = append(b, "nonce..."...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(fp)))
	b = append(b, fp...)
	return string(append(b, enc...))
}

func TestResponseRoundTrip(t *testing.T) {
	for _, want := range []*server.Response{
		{Status: http.StatusNoContent},
		{Status: http.StatusCreated, Header: http.Header{"Location": {"/x"}}, BodyOmitted: true},
		{Status: 299, Header: http.Header{
			"X-Binary": {"\x00\x01\xff", ""},
			"X-Order":  {"z", "a", "m"},
			"X-Empty":  {},
		}, Body: bytes.Repeat([]byte{0, 0xff, '\n'}, 300)},
	} {
		fp, got, err := decodeCompleted(completedRecord(t, "fp\x00\xff", want))
		if err != nil {
			t.Fatalf("decodeCompleted error = %v", err)
		}
		if fp != "fp\x00\xff" {
			t.Errorf("fingerprint = %q, want %q", fp, "fp\x00\xff")
		}
		if got.Status != want.Status || got.BodyOmitted != want.BodyOmitted || !bytes.Equal(got.Body, want.Body) {
			t.Errorf("decoded %d %v %d bytes, want %d %v %d bytes", got.Status, got.BodyOmitted, len(got.Body), want.Status, want.BodyOmitted, len(want.Body))
		}
		if len(got.Header) != len(want.Header) {
			t.Errorf("decoded %d headers, want %d", len(got.Header), len(want.Header))
		}
		for k, vs := range want.Header {
			if g, ok := got.Header[k]; !ok || !slices.Equal(g, vs) {
				t.Errorf("header %q = %q, want %q", k, g, vs)
			}
		}
		// Values share a backing array: appending to one must not change
		// another.
		for k := range got.Header {
			got.Header[k] = append(got.Header[k], "appended")
		}
		for k, vs := range want.Header {
			if g := got.Header[k]; !slices.Equal(g[:len(g)-1], vs) {
				t.Errorf("after appending, header %q = %q, want %q and the appended value", k, g, vs)
			}
		}
	}
}

func TestEncodeResponseRefuses(t *testing.T) {
	for _, resp := range []*server.Response{nil, {Status: -1}, {Status: 1 << 16}} {
		if _, err := encodeResponse(resp); err == nil {
			t.Errorf("encodeResponse(%+v) error = nil, want an error", resp)
		}
	}
}

// Every prefix of a record, and every single-byte change to its header, is
// refused as corrupt or decodes to something: never a panic, never another
// error.
func TestDecodeDamagedRecords(t *testing.T) {
	rec := completedRecord(t, "fp", &server.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/1"}, "X-Two": {"a", "b"}},
		Body:   []byte(`{"id":1}`),
	})
	for n := range len(rec) {
		if _, _, err := decodeCompleted(rec[:n]); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("decodeCompleted of the first %d of %d bytes error = %v, want ErrCorruptRecord", n, len(rec), err)
		}
	}
	for i := range len(rec) - 8 { // the body's bytes decode to another body
		for _, c := range []byte{0, 1, 0x7f, 0x80, 0xff} {
			b := []byte(rec)
			b[i] = c
			if _, _, err := decodeCompleted(string(b)); err != nil && !errors.Is(err, ErrCorruptRecord) {
				t.Errorf("decodeCompleted with byte %d set to %#x error = %v, want nil or ErrCorruptRecord", i, c, err)
			}
		}
	}
}

func FuzzDecodeCompleted(f *testing.F) {
	f.Add(completedRecord(f, "fp", &server.Response{Status: 200, Header: http.Header{"A": {"b", "c"}}, Body: []byte("body")}))
	f.Add(completedRecord(f, "", &server.Response{Status: 204}))
	f.Fuzz(func(t *testing.T, rec string) {
		fp, resp, err := decodeCompleted(rec)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("decodeCompleted error = %v, want ErrCorruptRecord", err)
			}
			return
		}
		// What decodes encodes to a record that decodes the same.
		fp2, resp2, err := decodeCompleted(completedRecord(t, fp, resp))
		if err != nil {
			t.Fatalf("decodeCompleted of a re-encoded record error = %v", err)
		}
		if fp2 != fp || resp2.Status != resp.Status || resp2.BodyOmitted != resp.BodyOmitted ||
			!bytes.Equal(resp2.Body, resp.Body) || len(resp2.Header) != len(resp.Header) {
			t.Fatalf("re-encoded record decodes to %q %+v, want %q %+v", fp2, resp2, fp, resp)
		}
		for k, vs := range resp.Header {
			if !slices.Equal(resp2.Header[k], vs) {
				t.Fatalf("re-encoded header %q = %q, want %q", k, resp2.Header[k], vs)
			}
		}
	})
}

func TestRecordKey(t *testing.T) {
	for _, tc := range []struct {
		id   server.ID
		want string
	}{
		{server.ID{}, "p:0::"},
		{server.ID{Scope: "a:b", Key: "c"}, "p:3:a:b:c"},
		{server.ID{Scope: "a", Key: "b:c"}, "p:1:a:b:c"},
		{server.ID{Scope: "tenant-0123456789", Key: "k"}, "p:17:tenant-0123456789:k"},
	} {
		if got := recordKey("p:", tc.id); got != tc.want {
			t.Errorf("recordKey(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}
