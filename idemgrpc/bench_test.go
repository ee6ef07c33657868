package idemgrpc_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/store/memstore"
)

// echo answers UnaryCall with its request's payload, and nothing else.
type echo struct {
	testgrpc.UnimplementedTestServiceServer
}

func (echo) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: req.GetPayload()}, nil
}

// benchClient serves echo on loopback, guarded by a Server on memstore
// when guarded, and returns a client of it.
func benchClient(b *testing.B, guarded bool) testgrpc.TestServiceClient {
	b.Helper()
	var opts []grpc.ServerOption
	if guarded {
		store, err := memstore.New()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { store.Close() })
		guard, err := idemgrpc.NewServer(store)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { guard.Shutdown(context.Background()) })
		opts = guard.ServerOptions()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(srv, echo{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	return testgrpc.NewTestServiceClient(conn)
}

// BenchmarkUnary: a unary call of 1 KiB over a loopback connection, to a
// server without the interceptor (bare), and through it on memstore: a
// first execution (a new key each time) and a replay. Client and server
// share the process, so the allocations are both sides'. Then the three in
// turns (paired), with the door's time over a bare call's:
//
//	go test ./idemgrpc -run '^$' -bench BenchmarkUnary -benchmem
func BenchmarkUnary(b *testing.B) {
	bare, guarded := benchClient(b, false), benchClient(b, true)
	req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1024)}}
	call := func(b *testing.B, c testgrpc.TestServiceClient, key func(int) string) {
		b.ReportAllocs()
		ctx := context.Background()
		for i := 0; b.Loop(); i++ {
			cctx := ctx
			if key != nil {
				cctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key(i))
			}
			if _, err := c.UnaryCall(cctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	b.Run("bare", func(b *testing.B) { call(b, bare, nil) })
	b.Run("bare+key", func(b *testing.B) {
		call(b, bare, func(i int) string { return "bare-" + run + "-" + strconv.Itoa(i) })
	})
	b.Run("first", func(b *testing.B) {
		n := strconv.Itoa(b.N)
		call(b, guarded, func(i int) string { return "first-" + run + "-" + n + "-" + strconv.Itoa(i) })
	})
	b.Run("replay", func(b *testing.B) {
		call(b, guarded, func(int) string { return "replay-" + run })
	})
	// The three kinds in turns of 50 calls, so that a shared machine's
	// load falls on all alike: each one's time per call, and the door's
	// over a bare call that sends a key.
	b.Run("paired", func(b *testing.B) {
		ctx := context.Background()
		kinds := []struct {
			name string
			c    testgrpc.TestServiceClient
			key  func(int) string
		}{
			{"bare+key", bare, func(i int) string { return "paired-bare-" + run + "-" + strconv.Itoa(i) }},
			{"first", guarded, func(i int) string { return "paired-first-" + run + "-" + strconv.Itoa(b.N) + "-" + strconv.Itoa(i) }},
			{"replay", guarded, func(int) string { return "paired-replay-" + run }},
		}
		spent := make([]time.Duration, len(kinds))
		for i := 0; i < b.N; i += 50 {
			for k, kind := range kinds {
				start := time.Now()
				for j := i; j < min(i+50, b.N); j++ {
					cctx := metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, kind.key(j))
					if _, err := kind.c.UnaryCall(cctx, req); err != nil {
						b.Fatal(err)
					}
				}
				spent[k] += time.Since(start)
			}
		}
		for k, kind := range kinds {
			b.ReportMetric(float64(spent[k].Microseconds())/float64(b.N), kind.name+"-µs/op")
		}
		b.ReportMetric(float64(spent[1])/float64(spent[0]), "first/bare")
		b.ReportMetric(float64(spent[2])/float64(spent[0]), "replay/bare")
	})
}
