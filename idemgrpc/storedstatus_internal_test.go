package idemgrpc

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestStoredStatus: a status round-trips whole through marshalStatus and
// unmarshalStatus, its message that is not UTF-8 included, and a record
// that proto.Marshal wrote (as earlier releases stored them) is read alike.
func TestStoredStatus(t *testing.T) {
	detail, err := anypb.New(&errdetails.ErrorInfo{Reason: "R", Domain: "d"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*spb.Status{
		{},
		{Code: 3, Message: "caf\xe9", Details: []*anypb.Any{detail}},
		{Code: 9, Message: "plain"},
		{Code: -1, Message: "\xff\x00"},
	} {
		b, err := marshalStatus(st)
		if err != nil {
			t.Fatalf("marshalStatus(%v): %v", st, err)
		}
		got, err := unmarshalStatus(b)
		if err != nil {
			t.Fatalf("unmarshalStatus(%q): %v", b, err)
		}
		if got.GetMessage() != st.GetMessage() || !proto.Equal(&spb.Status{Code: got.Code, Details: got.Details}, &spb.Status{Code: st.Code, Details: st.Details}) {
			t.Errorf("round trip of %v = %v", st, got)
		}
	}
	old, err := proto.Marshal(&spb.Status{Code: 5, Message: "not found", Details: []*anypb.Any{detail}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := unmarshalStatus(old)
	if err != nil || got.GetCode() != 5 || got.GetMessage() != "not found" || len(got.GetDetails()) != 1 {
		t.Errorf("unmarshalStatus(proto.Marshal) = %v, %v", got, err)
	}
	if _, err := unmarshalStatus([]byte{0x12, 0x05, 'a'}); err == nil {
		t.Error("unmarshalStatus(truncated) succeeded")
	}
}
