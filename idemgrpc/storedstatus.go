package idemgrpc

import (
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The field number of google.rpc.Status's message.
const statusMessageField = 2

// marshalStatus encodes st as a google.rpc.Status, with its message written
// as it is: protobuf refuses to marshal a string field that is not UTF-8,
// and a handler's error message may be anything (gRPC writes U+FFFD for
// such bytes on the wire, the first time and on a replay alike). The
// message comes after the other fields, which protobuf's decoders accept.
func marshalStatus(st *spb.Status) ([]byte, error) {
	rest := &spb.Status{Code: st.GetCode(), Details: st.GetDetails()}
	b, err := proto.Marshal(rest)
	if err != nil {
		return nil, err
	}
	if msg := st.GetMessage(); msg != "" {
		b = protowire.AppendTag(b, statusMessageField, protowire.BytesType)
		b = protowire.AppendString(b, msg)
	}
	return b, nil
}

// unmarshalStatus decodes what marshalStatus (or proto.Marshal) encoded.
func unmarshalStatus(b []byte) (*spb.Status, error) {
	var msg string
	rest := make([]byte, 0, len(b))
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("idemgrpc: stored status: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, fmt.Errorf("idemgrpc: stored status: %w", protowire.ParseError(m))
		}
		if num == statusMessageField && typ == protowire.BytesType {
			v, _ := protowire.ConsumeString(b[n:])
			msg = v
		} else {
			rest = append(rest, b[:n+m]...)
		}
		b = b[n+m:]
	}
	st := new(spb.Status)
	if err := proto.Unmarshal(rest, st); err != nil {
		return nil, fmt.Errorf("idemgrpc: stored status: %w", err)
	}
	st.Message = msg
	return st, nil
}
