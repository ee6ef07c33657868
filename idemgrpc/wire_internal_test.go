package idemgrpc

import (
	"context"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestWirePending: a request's bytes go from the codec to its call's slot
// by the InPayload that follows the decode, and nothing stays behind; the
// decodes that no InPayload follows (a unary call refused for a second
// message) are forgotten past the bound, and leave pending bounded.
func TestWirePending(t *testing.T) {
	w := newWire()
	ctx := w.TagRPC(context.Background(), &stats.RPCTagInfo{FullMethodName: "/s/m"})
	w.HandleRPC(ctx, &stats.Begin{})
	data := mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x02, 'h', 'i'})}

	m := new(wrapperspb.StringValue)
	if err := w.Unmarshal(data, m); err != nil {
		t.Fatal(err)
	}
	if m.GetValue() != "hi" {
		t.Fatalf("decoded %q, want hi", m.GetValue())
	}
	w.HandleRPC(ctx, &stats.InPayload{Payload: m})
	b, ok := takeRequestBytes(ctx)
	if !ok || string(b) != "\x0a\x02hi" {
		t.Errorf("takeRequestBytes() = %q, %v, want the bytes decoded", b, ok)
	}
	if _, ok := takeRequestBytes(ctx); ok {
		t.Error("the bytes were taken twice")
	}
	if n := w.pendingN.Load(); n != 0 {
		t.Errorf("pending = %d after the InPayload, want 0", n)
	}

	// A streaming call's bytes are not kept.
	sctx := w.TagRPC(context.Background(), &stats.RPCTagInfo{FullMethodName: "/s/stream"})
	w.HandleRPC(sctx, &stats.Begin{IsClientStream: true})
	m = new(wrapperspb.StringValue)
	if err := w.Unmarshal(data, m); err != nil {
		t.Fatal(err)
	}
	w.HandleRPC(sctx, &stats.InPayload{Payload: m})
	if _, ok := takeRequestBytes(sctx); ok {
		t.Error("a streaming call's bytes were kept")
	}

	for range 3 * maxPending {
		if err := w.Unmarshal(data, new(wrapperspb.StringValue)); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	w.pending.Range(func(any, any) bool { n++; return true })
	if n > maxPending || w.pendingN.Load() > maxPending {
		t.Errorf("pending holds %d (counted %d) after decodes without InPayload, want at most %d", n, w.pendingN.Load(), maxPending)
	}
}
