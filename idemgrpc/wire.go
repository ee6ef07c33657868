package idemgrpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// A call's fingerprint is made of the request's bytes as the client sent
// them, not of the request decoded and encoded again: a server of another
// release, whose schema has a field more or less, encodes the same request
// differently (a field it does not know is kept as unknown and written
// last; a closed enum's unknown value moves there too), so that the retry
// of a call that one release ran would be refused by the other.
//
// A unary interceptor sees only the decoded request. The bytes reach it
// this way: the Server's codec (grpc.ForceServerCodecV2), which decodes
// every request, keeps each message's bytes in pending, keyed by the
// message; the InPayload event that gRPC gives the stats handlers right
// after (on the same goroutine, with the same message) moves them into the
// call's context, where the handler put a slot for them (TagRPC); the
// interceptor takes them from there. Every decoded message gets its InPayload
// but one: the second message a client sends on a unary call, which gRPC
// decodes only to refuse the call. pending is bounded for those.

// Bounds of pending: past either, it is emptied. An entry lives from a
// decode to the InPayload that follows it, so pending holds about one
// message per call being decoded at that moment.
const (
	maxPending      = 1024
	maxPendingBytes = 32 << 20
)

// wire is a Server's codec and stats handler.
type wire struct {
	base encoding.CodecV2 // the registered protobuf codec, for the answers

	pending      sync.Map // decoded message -> its bytes
	pendingN     atomic.Int64
	pendingBytes atomic.Int64
}

func newWire() *wire {
	w := &wire{base: encoding.GetCodecV2(grpcproto.Name)}
	if w.base == nil {
		w.base = protoCodec{}
	}
	return w
}

// requestSlot is where a call's request bytes wait for the interceptor, in
// the call's context.
type requestSlot struct {
	unary bool   // set by Begin: only a unary call's bytes are kept
	body  []byte // the request as the client sent it; nil once taken
	seen  bool   // body was set
}

type requestSlotKey struct{}

// takeRequestBytes returns the bytes of the request of ctx's call, as the
// client sent them, and forgets them; false when the Server's codec and
// stats handler were not installed (see Server.ServerOptions).
func takeRequestBytes(ctx context.Context) ([]byte, bool) {
	s, _ := ctx.Value(requestSlotKey{}).(*requestSlot)
	if s == nil || !s.seen {
		return nil, false
	}
	b := s.body
	s.body, s.seen = nil, false
	return b, true
}

// Name is the protobuf codec's: the content-subtype stays "proto".
func (w *wire) Name() string { return grpcproto.Name }

// Marshal encodes an answer with the registered protobuf codec.
func (w *wire) Marshal(v any) (mem.BufferSlice, error) { return w.base.Marshal(v) }

// Unmarshal decodes a request, and keeps its bytes for the InPayload event
// that follows.
func (w *wire) Unmarshal(data mem.BufferSlice, v any) error {
	if err := w.base.Unmarshal(data, v); err != nil {
		return err
	}
	// A copy: gRPC reuses data's buffers once this returns.
	b := data.Materialize()
	if w.pendingN.Add(1) > maxPending || w.pendingBytes.Add(int64(len(b))) > maxPendingBytes {
		// Left by calls refused after their decode: forget them all.
		// A call decoded at this very moment loses its bytes, and is
		// fingerprinted from its request encoded again.
		w.pending.Clear()
		w.pendingN.Store(0)
		w.pendingBytes.Store(0)
		return nil
	}
	w.pending.Store(v, b)
	return nil
}

// TagRPC gives every call a slot for its request's bytes.
func (w *wire) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, requestSlotKey{}, new(requestSlot))
}

// HandleRPC moves the bytes of a decoded request from pending into its
// call's slot.
func (w *wire) HandleRPC(ctx context.Context, st stats.RPCStats) {
	switch st := st.(type) {
	case *stats.Begin:
		if s, _ := ctx.Value(requestSlotKey{}).(*requestSlot); s != nil && !st.Client {
			s.unary = !st.IsClientStream && !st.IsServerStream
		}
	case *stats.InPayload:
		if st.Client {
			return
		}
		v, ok := w.pending.LoadAndDelete(st.Payload)
		if !ok {
			return
		}
		b := v.([]byte)
		w.pendingN.Add(-1)
		w.pendingBytes.Add(-int64(len(b)))
		if s, _ := ctx.Value(requestSlotKey{}).(*requestSlot); s != nil && s.unary && !s.seen {
			s.body, s.seen = b, true
		}
	}
}

// TagConn returns ctx: nothing is kept of connections.
func (w *wire) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn does nothing.
func (w *wire) HandleConn(context.Context, stats.ConnStats) {}

// messageOf returns v as a protobuf message (of API v2), or nil.
func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// protoCodec is protobuf's encoding, for when no codec is registered under
// "proto" (the grpc/encoding/proto package registers one).
type protoCodec struct{}

func (protoCodec) Name() string { return grpcproto.Name }

func (protoCodec) Marshal(v any) (mem.BufferSlice, error) {
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("idemgrpc: cannot encode %T, not a protocol buffer message", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (protoCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("idemgrpc: cannot decode into %T, not a protocol buffer message", v)
	}
	return proto.Unmarshal(data.Materialize(), m)
}

// deterministic is the client's codec: protobuf's, marshalling
// deterministically, so that every attempt of a call sends the same bytes
// (proto.Marshal writes a map's entries in a random order), of which the
// server makes the call's fingerprint.
type deterministic struct{ base encoding.CodecV2 }

func newDeterministic() deterministic {
	base := encoding.GetCodecV2(grpcproto.Name)
	if base == nil {
		base = protoCodec{}
	}
	return deterministic{base: base}
}

func (deterministic) Name() string { return grpcproto.Name }

func (deterministic) Marshal(v any) (mem.BufferSlice, error) {
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("idemgrpc: cannot encode %T, not a protocol buffer message", v)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (d deterministic) Unmarshal(data mem.BufferSlice, v any) error { return d.base.Unmarshal(data, v) }
