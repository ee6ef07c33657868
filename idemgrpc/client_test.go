package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemgrpc"
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
	f := newFixture(t, fixtureOptions{svc: svc, client: clientInterceptor(t, idemgrpc.WithBackoff(0, 0), idemgrpc.WithMaxAttempts(3),
		idemgrpc.WithCallObserver(func(_ context.Context, method string, r idemgrpc.Report, err error) {
			observed = r
			panic("an observer's panic is recovered")
		}))})
	_, err := f.client().UnaryCall(testContext(t), request("a"))
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

// TestClientMethods: an unprotected method gets no key.
func TestClientMethods(t *testing.T) {
	svc := &service{eff: newEffects()}
	f := newFixture(t, fixtureOptions{svc: svc, client: clientInterceptor(t, idemgrpc.WithMethodFilter(func(m string) bool { return !strings.HasSuffix(m, "/UnaryCall") }))})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	if got := svc.seenKeys(); len(got) != 1 || got[0] != "" || rep.Key != "" || rep.Attempts != 1 {
		t.Errorf("keys = %q, report %+v; want no key", got, rep)
	}
}

// TestAttemptTimeout: an attempt that runs out of time is retried with the
// same key; the server released the key when the handler gave up.
func TestAttemptTimeout(t *testing.T) {
	svc := &service{eff: newEffects(), hangFirst: true}
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), svc: svc,
		serverOpts: []idemgrpc.ServerOption{idemgrpc.WithRetryAfter(10 * time.Millisecond)},
		client:     clientInterceptor(t, idemgrpc.WithAttemptTimeout(100*time.Millisecond), idemgrpc.WithBackoff(time.Millisecond, 10*time.Millisecond), idemgrpc.WithMaxAttempts(100))})
	var rep idemgrpc.Report
	if _, err := f.client().UnaryCall(testContext(t), request("a"), idemgrpc.WithReport(&rep)); err != nil {
		t.Fatal(err)
	}
	allSame(t, svc.seenKeys(), 2)
	if rep.Attempts < 2 {
		t.Errorf("attempts = %d, want 2 or more", rep.Attempts)
	}
}

func TestClientOptionsInvalid(t *testing.T) {
	_, err := idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(0), idemgrpc.WithBackoff(time.Second, time.Millisecond),
		idemgrpc.WithRetryCodes(codes.OK), idemgrpc.WithAttemptTimeout(-1), nil)
	if err == nil {
		t.Fatal("no error for invalid options")
	}
	for _, want := range []string{"max attempts", "backoff", "OK", "attempt timeout", "nil option"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestKeyFuncError(t *testing.T) {
	boom := errors.New("no entropy")
	f := newFixture(t, fixtureOptions{client: clientInterceptor(t, idemgrpc.WithKeyFunc(func() (string, error) { return "", boom }))})
	if _, err := f.client().UnaryCall(testContext(t), request("a")); !errors.Is(err, boom) {
		t.Fatalf("%v, want %v", err, boom)
	}
}

func TestServerOptionsInvalid(t *testing.T) {
	_, err := idemgrpc.NewServer(teststores.Memory(t), idemgrpc.WithReleaseCodes(codes.OK), idemgrpc.WithTTL(time.Nanosecond), nil,
		idemgrpc.WithLogger(nil), idemgrpc.WithObserver(nil), idemgrpc.WithKeyFormat(nil))
	if err == nil {
		t.Fatal("no error for invalid options")
	}
	for _, want := range []string{"OK", "TTL", "nil option", "nil logger", "nil observer", "nil key format"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
