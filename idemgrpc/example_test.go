package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/server/memstore"
)

// orders is a service whose UnaryCall has an effect: it counts its runs.
type orders struct {
	testgrpc.UnimplementedTestServiceServer
	runs int
}

func (o *orders) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	o.runs++
	return &testgrpc.SimpleResponse{Username: fmt.Sprintf("order %s, run %d", req.GetPayload().GetBody(), o.runs)}, nil
}

// A server protected by the server interceptor, and a client whose calls
// carry a key: the second call with the same key gets the first answer,
// replayed, and the handler ran once.
func Example() {
	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	guard, err := idemgrpc.NewServer(store)
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(guard.UnaryServerInterceptor()))
	svc := &orders{}
	testgrpc.RegisterTestServiceServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer func() {
		srv.Stop()
		guard.Shutdown(context.Background())
	}()

	ci, err := idemgrpc.UnaryClientInterceptor()
	if err != nil {
		panic(err)
	}
	conn, err := grpc.NewClient(ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(ci))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := testgrpc.NewTestServiceClient(conn)

	// One key for two calls, as two attempts of one call would have: the
	// interceptor keeps a key the caller chose.
	ctx := context.Background()
	ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "order-42")
	for range 2 {
		var rep idemgrpc.Report
		resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("42")}}, idemgrpc.WithReport(&rep))
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s (replayed: %v)\n", resp.GetUsername(), rep.Replayed)
	}
	fmt.Println("runs:", svc.runs)
	// Output:
	// order 42, run 1 (replayed: false)
	// order 42, run 1 (replayed: true)
	// runs: 1
}
