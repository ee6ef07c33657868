package idemgrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// The service of the tests of this file, built at run time so that two
// releases of its schema can serve side by side:
//
//	package rollout;
//	service Orders { rpc Create(CreateRequest) returns (CreateReply); }
//	message CreateReply { string order = 1; }
const createMethod = "/rollout.Orders/Create"

// release is one release of the schema: the fields of CreateRequest.
type release struct {
	syntax string // "proto2" or "proto3"
	fields []*descriptorpb.FieldDescriptorProto
	nested []*descriptorpb.DescriptorProto
}

func field(name string, number int32, typ descriptorpb.FieldDescriptorProto_Type, label descriptorpb.FieldDescriptorProto_Label, typeName string) *descriptorpb.FieldDescriptorProto {
	f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(number), Type: typ.Enum(), Label: label.Enum()}
	if typeName != "" {
		f.TypeName = proto.String(typeName)
	}
	return f
}

const (
	optional = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
	repeated = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
	tString  = descriptorpb.FieldDescriptorProto_TYPE_STRING
	tInt32   = descriptorpb.FieldDescriptorProto_TYPE_INT32
	tMessage = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
)

// file builds the release's file descriptor.
func (r release) file(t *testing.T) protoreflect.FileDescriptor {
	t.Helper()
	fdp := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("rollout.proto"),
		Package: proto.String("rollout"),
		Syntax:  proto.String(r.syntax),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("CreateRequest"), Field: r.fields, NestedType: r.nested},
			{Name: proto.String("CreateReply"), Field: []*descriptorpb.FieldDescriptorProto{field("order", 1, tString, optional, "")}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Orders"),
			Method: []*descriptorpb.MethodDescriptorProto{{
				Name: proto.String("Create"), InputType: proto.String(".rollout.CreateRequest"), OutputType: proto.String(".rollout.CreateReply"),
			}},
		}},
	}
	fd, err := protodesc.NewFile(fdp, new(protoregistry.Files))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// replica is a gRPC server of one release, on loopback, protected by a
// Server over a store shared with the other releases, and a connection to
// it.
type replica struct {
	fd   protoreflect.FileDescriptor
	conn *grpc.ClientConn
	runs atomic.Int32
}

// startReplica serves r with the Server installed by ServerOptions, or,
// with interceptorOnly, by its unary interceptor alone.
func startReplica(t *testing.T, store engine.Store, r release, interceptorOnly bool, logger *slog.Logger, dial ...grpc.DialOption) *replica {
	t.Helper()
	rep := &replica{fd: r.file(t)}
	reqType := rep.fd.Messages().ByName("CreateRequest")
	replyType := rep.fd.Messages().ByName("CreateReply")
	guard, err := idemgrpc.NewServer(store, idemgrpc.WithConfig(engine.Config{Logger: logger}),
		idemgrpc.WithResponseType(createMethod, dynamicpb.NewMessage(replyType)))
	if err != nil {
		t.Fatal(err)
	}
	opts := guard.ServerOptions()
	if interceptorOnly {
		opts = []grpc.ServerOption{grpc.ChainUnaryInterceptor(guard.UnaryServerInterceptor())}
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "rollout.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Create",
			Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := dynamicpb.NewMessage(reqType)
				if err := dec(in); err != nil {
					return nil, err
				}
				handler := func(context.Context, any) (any, error) {
					n := rep.runs.Add(1)
					reply := dynamicpb.NewMessage(replyType)
					reply.Set(replyType.Fields().ByName("order"), protoreflect.ValueOfString(fmt.Sprintf("order %d", n)))
					return reply, nil
				}
				if interceptor == nil {
					return handler(ctx, in)
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{FullMethod: createMethod}, handler)
			},
		}},
	}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	rep.conn, err = grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rep.conn.Close()
		srv.Stop()
		<-served
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := guard.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return rep
}

// create calls Create with key; it returns the answer's order, whether it
// was replayed, and the call's error.
func (rep *replica) create(ctx context.Context, key string, req proto.Message) (string, bool, error) {
	reply := dynamicpb.NewMessage(rep.fd.Messages().ByName("CreateReply"))
	var header metadata.MD
	err := rep.conn.Invoke(metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key), createMethod, req, reply, grpc.Header(&header))
	return reply.Get(reply.Descriptor().Fields().ByName("order")).String(), idemgrpc.Replayed(header), err
}

// reencoded returns the request's bytes decoded with rep's schema and
// encoded again, deterministically: what fingerprinting the decoded
// request would hash.
func (rep *replica) reencoded(t *testing.T, b []byte) []byte {
	t.Helper()
	m := dynamicpb.NewMessage(rep.fd.Messages().ByName("CreateRequest"))
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The schema changes of a rolling deploy: the two releases of each encode
// the same client bytes differently once decoded.
var rollouts = []struct {
	name   string
	v1, v2 release
	fill   func(m *dynamicpb.Message) // the client's request, of v2
}{
	{
		// A field added (numbered below the others: a field the old
		// release does not know is written last when it encodes the
		// request again).
		name: "field added",
		v1:   release{syntax: "proto3", fields: []*descriptorpb.FieldDescriptorProto{field("item", 2, tString, optional, ""), field("count", 3, tInt32, optional, "")}},
		v2:   release{syntax: "proto3", fields: []*descriptorpb.FieldDescriptorProto{field("coupon", 1, tString, optional, ""), field("item", 2, tString, optional, ""), field("count", 3, tInt32, optional, "")}},
		fill: func(m *dynamicpb.Message) {
			f := m.Descriptor().Fields()
			m.Set(f.ByName("coupon"), protoreflect.ValueOfString("SPRING"))
			m.Set(f.ByName("item"), protoreflect.ValueOfString("book"))
			m.Set(f.ByName("count"), protoreflect.ValueOfInt32(2))
		},
	},
}

// TestRollingDeploy: during a rolling deploy that changes the request's
// schema, a call run by a replica of one release and retried, with the same
// bytes and key, on a replica of the other is replayed, not refused as a
// key reused for another request: the fingerprint is made of the bytes
// the client sent, not of the request as each release encodes it again.
// Installed with its unary interceptor alone, the Server cannot see those
// bytes: it says so once, and the other release refuses the retry.
func TestRollingDeploy(t *testing.T) {
	for _, tc := range rollouts {
		t.Run(tc.name, func(t *testing.T) {
			store := teststores.Memory(t)
			discard := slog.New(slog.DiscardHandler)
			// The client interceptor: every call sends the same bytes.
			ci := grpc.WithChainUnaryInterceptor(clientInterceptor(t))
			v1 := startReplica(t, store, tc.v1, false, discard, ci)
			v2 := startReplica(t, store, tc.v2, false, discard, ci)
			req := dynamicpb.NewMessage(v2.fd.Messages().ByName("CreateRequest"))
			tc.fill(req)
			sent, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(v1.reencoded(t, sent), v2.reencoded(t, sent)) {
				t.Fatal("the two releases encode the request alike: the case tests nothing")
			}
			ctx := testContext(t)
			for i, order := range [][2]*replica{{v2, v1}, {v1, v2}} {
				key := fmt.Sprintf("rollout-%d", i)
				first, replayed, err := order[0].create(ctx, key, req)
				if err != nil || replayed {
					t.Fatalf("first call: %q, replayed %v, %v", first, replayed, err)
				}
				again, replayed, err := order[1].create(ctx, key, req)
				if err != nil {
					t.Fatalf("retry on the other release: %v (%s)", err, idemgrpc.Reason(err))
				}
				if !replayed || again != first {
					t.Errorf("retry on the other release: %q, replayed %v, want %q replayed", again, replayed, first)
				}
			}
			if runs := v1.runs.Load() + v2.runs.Load(); runs != 2 {
				t.Errorf("runs = %d, want 2", runs)
			}
		})
	}
	t.Run("interceptor alone", func(t *testing.T) {
		tc := rollouts[0]
		store := teststores.Memory(t)
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		ci := grpc.WithChainUnaryInterceptor(clientInterceptor(t))
		v1 := startReplica(t, store, tc.v1, true, logger, ci)
		v2 := startReplica(t, store, tc.v2, true, logger, ci)
		req := dynamicpb.NewMessage(v2.fd.Messages().ByName("CreateRequest"))
		tc.fill(req)
		ctx := testContext(t)
		if _, _, err := v2.create(ctx, "alone", req); err != nil {
			t.Fatal(err)
		}
		_, _, err := v1.create(ctx, "alone", req)
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("retry on the other release: %v, want FailedPrecondition (the decoded request differs)", err)
		}
		if n := strings.Count(logs.String(), "the request's bytes were not seen"); n != 2 {
			t.Errorf("warnings = %d, want one per Server; log:\n%s", n, logs.String())
		}
	})
}

// TestRetrySendsSameBytes: the client interceptor's attempts of one call
// send the same bytes, although proto.Marshal writes a map's entries in a
// random order, so that the retry of a call whose answer was lost is
// replayed rather than refused as another request.
func TestRetrySendsSameBytes(t *testing.T) {
	entry := &descriptorpb.DescriptorProto{
		Name:    proto.String("AttrsEntry"),
		Field:   []*descriptorpb.FieldDescriptorProto{field("key", 1, tString, optional, ""), field("value", 2, tString, optional, "")},
		Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
	}
	schema := release{syntax: "proto3", nested: []*descriptorpb.DescriptorProto{entry},
		fields: []*descriptorpb.FieldDescriptorProto{field("item", 1, tString, optional, ""), field("attrs", 2, tMessage, repeated, ".rollout.CreateRequest.AttrsEntry")}}
	// The first attempt of each call runs, and its answer is lost.
	var attempts atomic.Int32
	loseFirst := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if attempts.Add(1)%2 == 1 {
			return status.Error(codes.Unavailable, "answer lost")
		}
		return err
	}
	ci := clientInterceptor(t, idemgrpc.WithBackoff(time.Millisecond, time.Millisecond))
	rep := startReplica(t, teststores.Memory(t), schema, false, slog.New(slog.DiscardHandler), grpc.WithChainUnaryInterceptor(ci, loseFirst))
	ctx := testContext(t)
	const calls = 20
	for i := range calls {
		req := dynamicpb.NewMessage(rep.fd.Messages().ByName("CreateRequest"))
		req.Set(req.Descriptor().Fields().ByName("item"), protoreflect.ValueOfString("book"))
		attrs := req.Mutable(req.Descriptor().Fields().ByName("attrs")).Map()
		for j := range 16 {
			attrs.Set(protoreflect.ValueOfString(fmt.Sprintf("k%d", j)).MapKey(), protoreflect.ValueOfString("v"))
		}
		reply := dynamicpb.NewMessage(rep.fd.Messages().ByName("CreateReply"))
		var report idemgrpc.Report
		if err := rep.conn.Invoke(ctx, createMethod, req, reply, idemgrpc.WithReport(&report)); err != nil {
			t.Fatalf("call %d: %v (%s)", i, err, idemgrpc.Reason(err))
		}
		if report.Attempts != 2 || !report.Replayed {
			t.Errorf("call %d: %d attempts, replayed %v; want the second replayed", i, report.Attempts, report.Replayed)
		}
	}
	if n := rep.runs.Load(); n != calls {
		t.Errorf("runs = %d, want %d", n, calls)
	}
}
