package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/internal/testkit/configcases"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

func allSame(t *testing.T, keys []string, want int) string {
	t.Helper()
	if len(keys) != want {
		t.Fatalf("executions = %d (keys %q), want %d", len(keys), keys, want)
	}
	for _, k := range keys {
		if k == "" || k != keys[0] {
			t.Fatalf("keys = %q, want one key on every attempt", keys)
		}
	}
	return keys[0]
}

// TestRetryLoop: the interceptor retries Unavailable with the same key, and
// reports the attempts.
func TestRetryLoop(t *testing.T) {
	svc := &service{eff: newEffects(), failFirst: 2}
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), svc: svc, client: clientInterceptor(t, idemgrpc.WithBackoff(0, 0))})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	key := allSame(t, svc.seenKeys(), 3)
	if rep.Attempts != 3 || rep.Key != key || rep.Replayed {
		t.Errorf("report = %+v, want 3 attempts with key %q, not replayed", rep, key)
	}
}

// TestRetryLoopGivesUp: after WithMaxAttempts attempts, the last error.
func TestRetryLoopGivesUp(t *testing.T) {
	svc := &service{eff: newEffects(), failFirst: 10}
	var observed idemgrpc.Report
	f := newFixture(t, fixtureOptions{svc: svc, client: clientInterceptor(t, idemgrpc.WithBackoff(0, 0), idemgrpc.WithMaxAttempts(3))})
	_, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&observed))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("%v, want Unavailable", err)
	}
	allSame(t, svc.seenKeys(), 3)
	if observed.Attempts != 3 {
		t.Errorf("observed attempts = %d, want 3", observed.Attempts)
	}
}

// TestGRPCRetryPolicyCarriesKey: gRPC's own retries run below the
// interceptor, with the metadata it set once: every attempt has the key.
func TestGRPCRetryPolicyCarriesKey(t *testing.T) {
	svc := &service{eff: newEffects(), failFirst: 2}
	f := newFixture(t, fixtureOptions{svc: svc, client: clientInterceptor(t, idemgrpc.WithMaxAttempts(1)),
		dialOpts: []grpc.DialOption{grpc.WithDefaultServiceConfig(retryPolicy)}})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	key := allSame(t, svc.seenKeys(), 3)
	if rep.Attempts != 1 || rep.Key != key {
		t.Errorf("report = %+v, want 1 attempt of the interceptor with key %q", rep, key)
	}
}

// TestCallerKey: a key in the outgoing metadata, or from
// idempotency.ContextWithKey, is the one sent.
func TestCallerKey(t *testing.T) {
	svc := &service{eff: newEffects()}
	f := newFixture(t, fixtureOptions{svc: svc, client: clientInterceptor(t)})
	if _, err := f.client().UnaryCall(withKey(testContext(t), "mine"), request("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client().UnaryCall(idempotency.ContextWithKey(testContext(t), "from-context"), request("b")); err != nil {
		t.Fatal(err)
	}
	if got := svc.seenKeys(); len(got) != 2 || got[0] != "mine" || got[1] != "from-context" {
		t.Errorf("keys = %q, want [mine from-context]", got)
	}
}

// TestClientMethods: a method left out of WithMethods gets no key.
func TestClientMethods(t *testing.T) {
	svc := &service{eff: newEffects()}
	f := newFixture(t, fixtureOptions{svc: svc, client: clientInterceptor(t, idemgrpc.WithMethods(testgrpc.TestService_EmptyCall_FullMethodName))})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	if got := svc.seenKeys(); len(got) != 1 || got[0] != "" || rep.Key != "" || rep.Attempts != 1 {
		t.Errorf("keys = %q, report %+v; want no key", got, rep)
	}
}

// TestAttemptTimeout: an attempt that runs out of time, bounded by an
// interceptor chained after the client's (which runs once per attempt), is
// retried with the same key; the server released the key when the handler
// gave up.
func TestAttemptTimeout(t *testing.T) {
	svc := &service{eff: newEffects(), hangFirst: true}
	ci := clientInterceptor(t, idemgrpc.WithBackoff(time.Millisecond, 10*time.Millisecond), idemgrpc.WithMaxAttempts(100))
	perAttempt := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	chained := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return ci(ctx, method, req, reply, cc, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			return perAttempt(ctx, method, req, reply, cc, invoker, opts...)
		}, opts...)
	}
	f := newFixture(t, fixtureOptions{cfg: engine.Config{RetryAfter: 10 * time.Millisecond}, store: teststores.Memory(t), svc: svc, client: chained})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	allSame(t, svc.seenKeys(), 2)
	if rep.Attempts < 2 {
		t.Errorf("attempts = %d, want 2 or more", rep.Attempts)
	}
}

// TestCanceledAttemptRetried: an attempt that ends Canceled while the
// caller's context is live (cancelled by a per-attempt deadline chained
// after the interceptor, which the server may answer before the client
// sees its own deadline) is sent again with the same key; the caller's
// own cancellation is not retried.
func TestCanceledAttemptRetried(t *testing.T) {
	svc := &service{eff: newEffects()}
	ci := clientInterceptor(t, idemgrpc.WithBackoff(time.Millisecond, 10*time.Millisecond))
	var attempts atomic.Int32
	chained := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return ci(ctx, method, req, reply, cc, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			if attempts.Add(1) == 1 {
				return status.Error(codes.Canceled, "attempt cancelled")
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}, opts...)
	}
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), svc: svc, client: chained})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	if rep.Attempts != 2 || rep.Key == "" {
		t.Errorf("report %+v, want 2 attempts with a key", rep)
	}
	allSame(t, svc.seenKeys(), 1)

	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	attempts.Store(0)
	_, err := f.client().UnaryCall(ctx, request("b"), idemgrpc.WithReport(&rep))
	if status.Code(err) != codes.Canceled || rep.Attempts != 1 {
		t.Errorf("a call whose caller went away: %v after %d attempts, want Canceled after 1", err, rep.Attempts)
	}
}

func TestClientOptionsInvalid(t *testing.T) {
	_, err := idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(0), idemgrpc.WithBackoff(time.Second, time.Millisecond),
		idemgrpc.WithMaxRetryAfter(-1), nil, idemgrpc.WithKeyOptional(), idemgrpc.WithConfig(engine.Config{}))
	if err == nil {
		t.Fatal("no error for invalid options")
	}
	for _, want := range []string{"max attempts", "backoff", "max Retry-After -1ns", "option 3 is nil",
		"WithKeyOptional is an option of NewServer", "WithConfig is an option of NewServer"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestServerOptionsInvalid(t *testing.T) {
	_, err := idemgrpc.NewServer(teststores.Memory(t), idemgrpc.WithKeep(nil), nil, idemgrpc.WithKeyFormat(nil),
		idemgrpc.WithConfig(engine.Config{TTL: -1}), idemgrpc.WithMaxAttempts(2))
	if err == nil {
		t.Fatal("no error for invalid options")
	}
	for _, want := range []string{"WithKeep needs", "option 1 is nil", "WithKeyFormat needs", "TTL -1ns",
		"WithMaxAttempts is an option of UnaryClientInterceptor"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// TestConfigAsTheEngine: WithConfig is validated by engine.New, the same
// way in every door: a zero field is the engine's default, and an invalid
// configuration is refused with the engine's own message, after the
// package prefix.
func TestConfigAsTheEngine(t *testing.T) {
	store := teststores.Memory(t)
	for _, tc := range configcases.All() {
		t.Run(tc.Name, func(t *testing.T) {
			_, want := engine.New(store, tc.Config)
			s, err := idemgrpc.NewServer(store, idemgrpc.WithConfig(tc.Config))
			if want == nil {
				if err != nil || s == nil {
					t.Fatalf("NewServer() = %v, %v; want a Server", s, err)
				}
				return
			}
			if s != nil || err == nil {
				t.Fatalf("NewServer() = %v, %v; want an error", s, err)
			}
			if got := err.Error(); got != "idemgrpc: "+want.Error() {
				t.Errorf("error %q, want %q", got, "idemgrpc: "+want.Error())
			}
		})
	}
}

// TestMaxRetryAfter: a server's RetryInfo longer than WithMaxRetryAfter is
// cut to it: with the store failing and a Retry-After of an hour, three
// attempts end well within the test's time.
func TestMaxRetryAfter(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	store.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("store down")})
	f := newFixture(t, fixtureOptions{cfg: engine.Config{RetryAfter: time.Hour}, store: store,
		client: clientInterceptor(t, idemgrpc.WithMaxAttempts(3), idemgrpc.WithMaxRetryAfter(time.Millisecond))})
	var rep idemgrpc.Report
	_, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep))
	if status.Code(err) != codes.Unavailable || idemgrpc.Reason(err) != "STORE_UNAVAILABLE" {
		t.Fatalf("%v, want Unavailable, STORE_UNAVAILABLE", err)
	}
	if rep.Attempts != 3 {
		t.Errorf("attempts = %d, want 3", rep.Attempts)
	}
	if n := f.svc.eff.count("a"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}
