package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/memstore"
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

type principalKey struct{}

// authenticate stands for the application's authentication: it finds the
// account of the call's bearer token, and puts it in the context.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	accounts := map[string]string{"Bearer token-1": "acct_7", "Bearer token-2": "acct_7"}
	auth := md.Get("authorization")
	if len(auth) != 1 || accounts[auth[0]] == "" {
		return nil, status.Error(codes.Unauthenticated, "unknown token")
	}
	return handler(context.WithValue(ctx, principalKey{}, accounts[auth[0]]), req)
}

// accountFrom returns the account that authenticate put in the context.
func accountFrom(ctx context.Context) (string, error) {
	account, ok := ctx.Value(principalKey{}).(string)
	if !ok {
		return "", errors.New("unauthenticated")
	}
	return account, nil
}

// The server and the client, over a loopback connection. The first call
// runs the handler; a later call that sends the same key again (a process
// that stored the key with its operation, say) gets the stored answer.
func ExampleNewServer() {
	ctx := context.Background()
	store, err := memstore.New() // or pgstore, redisstore: any engine.Store
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// Server. Keys belong to the principal your authentication found, not
	// to its token, which a retry may carry refreshed.
	guard, err := idemgrpc.NewServer(store, idemgrpc.WithScope(
		func(ctx context.Context, _ string) (string, error) {
			return accountFrom(ctx) // set by your auth interceptor
		}))
	if err != nil {
		log.Fatal(err)
	}
	// Your interceptors first (gRPC chains them in the order of its options),
	// then the guard's interceptors, and the codec and stats handler through
	// which it fingerprints each request's bytes as the client sent them.
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(authenticate)},
		guard.ServerOptions()...)...)
	svc := &orders{}
	testgrpc.RegisterTestServiceServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer guard.Shutdown(ctx) // after the server stopped: waits for answers sent before they were stored
	go srv.Serve(ln)
	defer srv.GracefulStop()

	// Client.
	ci, err := idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(4))
	if err != nil {
		log.Fatal(err)
	}
	creds := grpc.WithTransportCredentials(insecure.NewCredentials()) // TLS in production
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithChainUnaryInterceptor(ci), creds)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := testgrpc.NewTestServiceClient(conn)

	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token-1")
	req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("42")}}
	var rep idemgrpc.Report
	resp, err := client.UnaryCall(ctx, req, idemgrpc.WithReport(&rep))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s; attempts %d, replayed %v\n", resp.GetUsername(), rep.Attempts, rep.Replayed)

	// The same key again: the interceptor keeps a key the caller set.
	again := idempotency.ContextWithKey(ctx, rep.Key)
	resp, err = client.UnaryCall(again, req, idemgrpc.WithReport(&rep))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s; attempts %d, replayed %v\n", resp.GetUsername(), rep.Attempts, rep.Replayed)
	// Output:
	// order 42, run 1; attempts 1, replayed false
	// order 42, run 1; attempts 1, replayed true
}

// A server protected by the idempotency Server, and a client whose calls
// carry a key: the second call with the same key gets the first answer,
// replayed, and the handler ran once. Keys belong to the account that the
// application authenticated (WithScope), so a retry whose token was
// refreshed in between is still the same caller's.
func Example() {
	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	guard, err := idemgrpc.NewServer(store, idemgrpc.WithScope(func(ctx context.Context, _ string) (string, error) {
		account, ok := ctx.Value(principalKey{}).(string)
		if !ok {
			return "", errors.New("unauthenticated")
		}
		return account, nil
	}))
	if err != nil {
		panic(err)
	}
	// The authentication first: gRPC chains interceptors in the order of
	// its options.
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(authenticate)}, guard.ServerOptions()...)...)
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
	for _, token := range []string{"token-1", "token-2"} {
		ctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
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

// fulfilment is a service whose UnaryCall charges, then ships: the first
// shipment fails after the charge.
type fulfilment struct {
	testgrpc.UnimplementedTestServiceServer
	charges, shipments int
}

func (f *fulfilment) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	receipt, err := step.Run(ctx, "charge", req.GetPayload().GetBody(), func(ctx context.Context) (string, error) {
		f.charges++ // a payment API called with the client: its key derives from "charge"
		return fmt.Sprintf("receipt-%d", f.charges), nil
	})
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if f.shipments++; f.shipments == 1 {
		// Unavailable releases the key: the client's next attempt
		// resumes after the charge.
		return nil, status.Error(codes.Unavailable, "warehouse unreachable")
	}
	return &testgrpc.SimpleResponse{Username: receipt + " shipped"}, nil
}

// A handler with a step behind the server interceptor: its first attempt
// fails after the charge, and the client's retry, with the same key,
// resumes after it.
func Example_steps() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	guard, err := idemgrpc.NewServer(store)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	svc := &fulfilment{}
	testgrpc.RegisterTestServiceServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		srv.Stop()
		guard.Shutdown(context.Background())
	}()

	ci, err := idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(3))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient(ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(ci))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	var rep idemgrpc.Report
	resp, err := testgrpc.NewTestServiceClient(conn).UnaryCall(context.Background(),
		&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("order-7")}}, idemgrpc.WithReport(&rep))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s after %d attempts; charges: %d\n", resp.GetUsername(), rep.Attempts, svc.charges)
	// Output:
	// receipt-1 shipped after 2 attempts; charges: 1
}
