package idemgrpc_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemgrpc"
)

// effects counts the handler's executions, by call id (the request's
// payload body).
type effects struct {
	mu    sync.Mutex
	runs  map[string]int
	total int
}

func newEffects() *effects { return &effects{runs: make(map[string]int)} }

func (e *effects) add(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.runs[id]++
	e.total++
	return e.runs[id]
}

func (e *effects) count(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[id]
}

// snapshot returns the number of executions and of calls that ran more
// than once.
func (e *effects) snapshot() (total, duplicated int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range e.runs {
		if n > 1 {
			duplicated++
		}
	}
	return e.total, duplicated
}

// service is the grpc.testing.TestService under test. UnaryCall counts an
// execution of its payload's id, sets a header and answers the id with the
// execution's number; with a ResponseStatus it fails with it instead.
// Before it answers it waits for block, if set.
type service struct {
	testgrpc.UnimplementedTestServiceServer
	eff        *effects
	block      chan struct{}
	started    chan struct{}
	failFirst  int  // the first failFirst executions of an id fail with Unavailable
	hangFirst  bool // the first execution of an id waits for its context to end
	panicFirst bool // the first execution of an id panics

	mu   sync.Mutex
	keys []string // the key of each execution
}

func (s *service) seenKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func (s *service) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	n := s.eff.add(string(req.GetPayload().GetBody()))
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.keys = append(s.keys, strings.Join(md.Get(idemgrpc.MetadataKey), ","))
	s.mu.Unlock()
	if n <= s.failFirst {
		return nil, status.Error(codes.Unavailable, "not yet")
	}
	if s.panicFirst && n == 1 {
		panic("first execution")
	}
	if s.hangFirst && n == 1 {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.block != nil {
		select {
		case <-s.block:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	grpc.SetHeader(ctx, metadata.Pairs("x-run", strconv.Itoa(n)))
	grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "t"))
	if st := req.GetResponseStatus(); st != nil && st.GetCode() != 0 {
		msg := st.GetMessage()
		if msg == latin1 {
			// What a request (proto3) cannot carry: a message that is
			// not UTF-8.
			msg = "caf\xe9 " + string(req.GetPayload().GetBody())
		}
		return nil, status.Error(codes.Code(st.GetCode()), msg)
	}
	return &testgrpc.SimpleResponse{Payload: req.GetPayload(), Username: strconv.Itoa(n)}, nil
}

// StreamingOutputCall counts an execution of "stream:" and its payload's
// id, and answers it once.
func (s *service) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	s.eff.add("stream:" + string(req.GetPayload().GetBody()))
	return stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: req.GetPayload()})
}

// latin1, as the message of a request's ResponseStatus, makes UnaryCall
// fail with a message that is not UTF-8: "caf\xe9 " and the payload's id.
const latin1 = "latin-1"

// fixture is a gRPC server on loopback, behind a lossProxy, and a client
// connection to it.
type fixture struct {
	svc   *service
	proxy *lossProxy
	conn  *grpc.ClientConn
	guard *idemgrpc.Server
}

// fixtureOptions says what a fixture has.
type fixtureOptions struct {
	store      engine.Store // nil: no server interceptor
	serverOpts []idemgrpc.Option
	// cfg is the server's engine configuration; its Logger discards by
	// default, since tests make the engine's warnings happen.
	cfg      engine.Config
	client   grpc.UnaryClientInterceptor // nil: none
	outer    grpc.UnaryServerInterceptor // nil: none; before the server interceptor
	dialOpts []grpc.DialOption
	svc      *service
}

func newFixture(t testing.TB, o fixtureOptions) *fixture {
	t.Helper()
	f := &fixture{svc: o.svc}
	if f.svc == nil {
		f.svc = &service{eff: newEffects()}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.proxy, err = startLossProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sopts := []grpc.ServerOption{grpc.StatsHandler(f.proxy.StatsHandler())}
	if o.store != nil {
		// The engine's warnings are expected here: tests make them happen.
		cfg := o.cfg
		if cfg.Logger == nil {
			cfg.Logger = slog.New(slog.DiscardHandler)
		}
		opts := append([]idemgrpc.Option{idemgrpc.WithConfig(cfg)}, o.serverOpts...)
		f.guard, err = idemgrpc.NewServer(o.store, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if o.outer != nil {
			sopts = append(sopts, grpc.ChainUnaryInterceptor(o.outer))
		}
		sopts = append(sopts, f.guard.ServerOptions()...)
	}
	srv := grpc.NewServer(sopts...)
	testgrpc.RegisterTestServiceServer(srv, f.svc)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 50 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if o.client != nil {
		dopts = append(dopts, grpc.WithChainUnaryInterceptor(o.client))
	}
	f.conn, err = grpc.NewClient("passthrough:///"+f.proxy.Addr(), append(dopts, o.dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.conn.Close()
		if f.svc.block != nil {
			select {
			case <-f.svc.block:
			default:
				close(f.svc.block)
			}
		}
		srv.Stop()
		<-served
		f.proxy.Close()
		if f.guard != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := f.guard.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
		}
	})
	return f
}

func (f *fixture) client() testgrpc.TestServiceClient { return testgrpc.NewTestServiceClient(f.conn) }

func request(id string) *testgrpc.SimpleRequest {
	return &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(id)}}
}

func failing(id string, code codes.Code, msg string) *testgrpc.SimpleRequest {
	r := request(id)
	r.ResponseStatus = &testgrpc.EchoStatus{Code: int32(code), Message: msg}
	return r
}

func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
}

func clientInterceptor(t testing.TB, opts ...idemgrpc.Option) grpc.UnaryClientInterceptor {
	t.Helper()
	ci, err := idemgrpc.UnaryClientInterceptor(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
