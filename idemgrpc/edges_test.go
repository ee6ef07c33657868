package idemgrpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// syncBuffer is a log sink that the server's goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func logTo(b *syncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, nil))
}

// events collects what an observer is told.
type events struct {
	mu  sync.Mutex
	all []engine.Event
}

func (e *events) observe(_ context.Context, ev engine.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ev.Kind != engine.EventAcquired {
		e.all = append(e.all, ev)
	}
}

// take returns the events so far, and forgets them.
func (e *events) take() []engine.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	all := e.all
	e.all = nil
	return all
}

func withBearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

type principalCtxKey struct{}

// authenticateTokens is the application's own authentication, in front of
// the server interceptor: it puts the principal of the bearer token in the
// context, and refuses an unknown token.
func authenticateTokens(tokens map[string]string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		auth := md.Get("authorization")
		if len(auth) != 1 || tokens[auth[0]] == "" {
			return nil, status.Error(codes.Unauthenticated, "unknown token")
		}
		return handler(context.WithValue(ctx, principalCtxKey{}, tokens[auth[0]]), req)
	}
}

func principalScope(ctx context.Context, _ string) (string, error) {
	p, ok := ctx.Value(principalCtxKey{}).(string)
	if !ok {
		return "", errors.New("no principal")
	}
	return "principal:" + p, nil
}

// TestBearerScope: under the default scope, a retry whose bearer token was
// refreshed falls in another scope and runs again (the property WithScope's
// doc warns of), and the first call scoped by a bearer token is logged once
// at warn level; with the scope set from the authenticated principal, the
// retry is a replay, and nothing is logged.
func TestBearerScope(t *testing.T) {
	const warning = "scoped by a bearer token"
	t.Run("default scope", func(t *testing.T) {
		var logs syncBuffer
		f := newFixture(t, fixtureOptions{cfg: engine.Config{Logger: logTo(&logs)}, store: teststores.Memory(t)})
		ctx := withKey(testContext(t), "order-1")
		_, err := f.client().UnaryCall(withBearer(ctx, "token-before-refresh"), request("o1"))
		if err != nil {
			t.Fatal(err)
		}
		var header metadata.MD
		_, err = f.client().UnaryCall(withBearer(ctx, "token-after-refresh"), request("o1"), grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.client().UnaryCall(withBearer(withKey(testContext(t), "order-2"), "token-after-refresh"), request("o2"))
		if err != nil {
			t.Fatal(err)
		}
		if n := f.svc.eff.count("o1"); n != 2 {
			t.Errorf("executions = %d, want 2: a refreshed token is another scope", n)
		}
		if idemgrpc.Replayed(header) {
			t.Error("the retry with the refreshed token was replayed")
		}
		if n := strings.Count(logs.String(), warning); n != 1 {
			t.Errorf("warnings = %d, want 1; log:\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "token-") {
			t.Errorf("want one warning, without the token; log:\n%s", logs.String())
		}
	})
	t.Run("principal", func(t *testing.T) {
		var logs syncBuffer
		f := newFixture(t, fixtureOptions{
			store:      teststores.Memory(t),
			cfg:        engine.Config{Logger: logTo(&logs)},
			serverOpts: []idemgrpc.Option{idemgrpc.WithScope(principalScope)},
			outer:      authenticateTokens(map[string]string{"Bearer token-before-refresh": "alice", "Bearer token-after-refresh": "alice"}),
		})
		ctx := withKey(testContext(t), "order-1")
		if _, err := f.client().UnaryCall(withBearer(ctx, "token-before-refresh"), request("o1")); err != nil {
			t.Fatal(err)
		}
		var header metadata.MD
		if _, err := f.client().UnaryCall(withBearer(ctx, "token-after-refresh"), request("o1"), grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		if n := f.svc.eff.count("o1"); n != 1 {
			t.Errorf("executions = %d, want 1", n)
		}
		if !idemgrpc.Replayed(header) {
			t.Error("the retry with the refreshed token was not replayed")
		}
		if strings.Contains(logs.String(), warning) {
			t.Errorf("warned with a principal scope; log:\n%s", logs.String())
		}
	})
}

// TestRejectionsObserved: every call the server interceptor refuses before
// any claim (InvalidArgument: the key missing or malformed, the scope
// unusable) is told to the observer as EventRejected with its code, as the
// HTTP middleware tells its 400s; a call without a key run unprotected
// under WithKeyOptional is EventUnprotected.
func TestRejectionsObserved(t *testing.T) {
	var seen events
	f := newFixture(t, fixtureOptions{cfg: engine.Config{Observer: seen.observe}, store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
		idemgrpc.WithKeyFormat(func(key string) error {
			if strings.HasPrefix(key, "bad") {
				return errors.New("not one of ours")
			}
			return nil
		}),
		idemgrpc.WithScope(func(ctx context.Context, _ string) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			switch strings.Join(md.Get("x-tenant"), ",") {
			case "":
				return "", errors.New("no tenant")
			case "long":
				return strings.Repeat("t", engine.MaxScopeLen+1), nil
			}
			return "tenant", nil
		}),
	}})
	tenant := func(ctx context.Context, v string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "x-tenant", v)
	}
	ctx := tenant(testContext(t), "acme")
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		reason string
		want   engine.ID // what the event names
	}{
		{"no key", ctx, "KEY_MISSING", engine.ID{}},
		{"two keys", withKey(withKey(ctx, "k1"), "k2"), "KEY_INVALID", engine.ID{}},
		{"too long", withKey(ctx, strings.Repeat("k", 256)), "KEY_INVALID", engine.ID{}},
		{"key format", withKey(ctx, "bad-1"), "KEY_INVALID", engine.ID{}},
		{"scope fails", withKey(testContext(t), "k"), "REQUEST_UNIDENTIFIED", engine.ID{Key: "k"}},
		{"scope too long", withKey(tenant(testContext(t), "long"), "k"), "REQUEST_UNIDENTIFIED", engine.ID{Key: "k"}},
	} {
		_, err := f.client().UnaryCall(tc.ctx, request("r"))
		if status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != tc.reason {
			t.Errorf("%s: err = %v, want InvalidArgument %s", tc.name, err, tc.reason)
		}
		got := seen.take()
		if len(got) != 1 {
			t.Errorf("%s: events = %v, want one", tc.name, got)
			continue
		}
		e := got[0]
		if e.Kind != engine.EventRejected || e.Status != int(codes.InvalidArgument) || (engine.ID{Scope: e.Scope, Key: e.Key}) != tc.want || e.Err == nil || e.Start.IsZero() {
			t.Errorf("%s: event = %+v, want rejected, InvalidArgument, %+v, with its error and start", tc.name, e, tc.want)
		}
	}
	if n := f.svc.eff.count("r"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}

	var optional events
	f = newFixture(t, fixtureOptions{cfg: engine.Config{Observer: optional.observe}, store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
		idemgrpc.WithKeyOptional(),
	}})
	if _, err := f.client().UnaryCall(testContext(t), request("r")); err != nil {
		t.Fatal(err)
	}
	if got := optional.take(); len(got) != 1 || got[0].Kind != engine.EventUnprotected {
		t.Errorf("keyless call under WithKeyOptional: events = %v, want one unprotected", got)
	}
}

// stream calls the server-streaming method and returns the error of the
// call, after reading its answers.
func stream(ctx context.Context, c testgrpc.TestServiceClient, id string) error {
	s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte(id)}})
	if err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// TestStreamingRefused: a streaming call that carries a key cannot be
// protected, so it is refused (Unimplemented, STREAMING_UNSUPPORTED) and
// does not run, and the observer is told; without a key, or on a method
// left out of WithMethods, it runs.
func TestStreamingRefused(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		var seen events
		f := newFixture(t, fixtureOptions{cfg: engine.Config{Observer: seen.observe}, store: teststores.Memory(t)})
		err := stream(withKey(testContext(t), "s-1"), f.client(), "s1")
		if status.Code(err) != codes.Unimplemented || idemgrpc.Reason(err) != "STREAMING_UNSUPPORTED" {
			t.Errorf("keyed stream: err = %v, want Unimplemented %s", err, "STREAMING_UNSUPPORTED")
		}
		if n := f.svc.eff.count("stream:s1"); n != 0 {
			t.Errorf("keyed stream ran %d times, want 0", n)
		}
		if got := seen.take(); len(got) != 1 || got[0].Kind != engine.EventRejected || got[0].Status != int(codes.Unimplemented) || got[0].Key != "" {
			t.Errorf("events = %+v, want one rejected, Unimplemented", got)
		}
		if err := stream(testContext(t), f.client(), "s2"); err != nil {
			t.Errorf("stream without a key: %v", err)
		}
		if n := f.svc.eff.count("stream:s2"); n != 1 {
			t.Errorf("stream without a key ran %d times, want 1", n)
		}
	})
	t.Run("not protected", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
			idemgrpc.WithMethods(testgrpc.TestService_UnaryCall_FullMethodName),
		}})
		if err := stream(withKey(testContext(t), "s-1"), f.client(), "s1"); err != nil {
			t.Errorf("keyed stream of a method not protected: %v", err)
		}
		if n := f.svc.eff.count("stream:s1"); n != 1 {
			t.Errorf("keyed stream of a method not protected ran %d times, want 1", n)
		}
	})
}

// TestStoredErrorNotUTF8: a handler's error whose message is not UTF-8
// (which protobuf refuses to marshal in a google.rpc.Status) is stored and
// replayed as gRPC delivered it the first time (it writes U+FFFD for the
// bytes that are not UTF-8), and the handler runs once, on every store.
func TestStoredErrorNotUTF8(t *testing.T) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{store: kind.New(t)})
			ctx := withKey(testContext(t), "latin-1")
			req := failing("l1", codes.InvalidArgument, latin1)
			_, first := f.client().UnaryCall(ctx, req)
			if status.Code(first) != codes.InvalidArgument || !strings.HasSuffix(status.Convert(first).Message(), " l1") {
				t.Fatalf("first call: %v, want InvalidArgument, the handler's", first)
			}
			var header metadata.MD
			_, err := f.client().UnaryCall(ctx, req, grpc.Header(&header))
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != status.Convert(first).Message() {
				t.Errorf("retry: %v, want %v replayed", err, first)
			}
			if !idemgrpc.Replayed(header) {
				t.Error("retry not replayed")
			}
			if n := f.svc.eff.count("l1"); n != 1 {
				t.Errorf("executions = %d, want 1", n)
			}
		})
	}
}
