package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// wantRefusal checks that err has code and the idempotency reason, and,
// if retry is set, a RetryInfo detail.
func wantRefusal(t *testing.T, err error, code codes.Code, reason string, retry bool) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("code = %v (%v), want %v", st.Code(), err, code)
	}
	if got := idemgrpc.Reason(err); got != reason {
		t.Errorf("Reason() = %q, want %q", got, reason)
	}
	hasRetry := false
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			hasRetry = true
		}
	}
	if hasRetry != retry {
		t.Errorf("RetryInfo = %v, want %v", hasRetry, retry)
	}
}

func TestKeyMissing(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t)})
	_, err := f.client().UnaryCall(testContext(t), request("a"))
	wantRefusal(t, err, codes.InvalidArgument, "KEY_MISSING", false)
	if n := f.svc.eff.count("a"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}

func TestKeyOptional(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), serverOpts: []idemgrpc.Option{idemgrpc.WithKeyOptional()}})
	for range 2 {
		if _, err := f.client().UnaryCall(testContext(t), request("a")); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.eff.count("a"); n != 2 {
		t.Errorf("executions = %d, want 2 (unprotected)", n)
	}
}

func TestUnprotectedMethod(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), serverOpts: []idemgrpc.Option{idemgrpc.WithMethods("/grpc.testing.TestService/EmptyCall")}})
	if _, err := f.client().UnaryCall(testContext(t), request("a")); err != nil {
		t.Fatalf("an unprotected method without a key: %v", err)
	}
}

func TestKeyInvalid(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
		idemgrpc.WithKeyFormat(func(k string) error {
			if strings.HasPrefix(k, "bad") {
				return errors.New("not a good key")
			}
			return nil
		}),
	}})
	for name, ctx := range map[string]context.Context{
		"too long":   withKey(testContext(t), strings.Repeat("k", 256)),
		"two values": withKey(withKey(testContext(t), "k1"), "k2"),
		"format":     withKey(testContext(t), "bad-key"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := f.client().UnaryCall(ctx, request("a"))
			wantRefusal(t, err, codes.InvalidArgument, "KEY_INVALID", false)
		})
	}
	if n := f.svc.eff.count("a"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}

func TestKeyMismatch(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t)})
	ctx := withKey(testContext(t), "k")
	if _, err := f.client().UnaryCall(ctx, request("a")); err != nil {
		t.Fatal(err)
	}
	_, err := f.client().UnaryCall(ctx, request("b"))
	wantRefusal(t, err, codes.FailedPrecondition, "KEY_MISMATCH", false)
	if n := f.svc.eff.count("b"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}

// TestScope: the same key from two credentials is two keys.
func TestScope(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t)})
	for _, cred := range []string{"Bearer alice", "Bearer bob"} {
		ctx := metadata.AppendToOutgoingContext(withKey(testContext(t), "k"), "authorization", cred)
		if _, err := f.client().UnaryCall(ctx, request(cred)); err != nil {
			t.Fatalf("%s: %v", cred, err)
		}
	}
}

// TestScopeTooLong: a scope function returning more than
// engine.MaxScopeLen bytes gets InvalidArgument, and the handler does not
// run.
func TestScopeTooLong(t *testing.T) {
	long := strings.Repeat("s", engine.MaxScopeLen+1)
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
		idemgrpc.WithScope(func(context.Context, string) (string, error) { return long, nil }),
	}})
	_, err := f.client().UnaryCall(withKey(testContext(t), "k"), request("a"))
	wantRefusal(t, err, codes.InvalidArgument, "REQUEST_UNIDENTIFIED", false)
	if n := f.svc.eff.count("a"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}

func TestInFlight(t *testing.T) {
	svc := &service{eff: newEffects(), block: make(chan struct{}), started: make(chan struct{}, 1)}
	f := newFixture(t, fixtureOptions{cfg: engine.Config{RetryAfter: 2 * time.Second}, store: teststores.Memory(t), svc: svc})
	ctx := withKey(testContext(t), "k")
	var wg sync.WaitGroup
	wg.Add(1)
	var firstErr error
	go func() {
		defer wg.Done()
		_, firstErr = f.client().UnaryCall(ctx, request("a"))
	}()
	<-svc.started
	var trailer metadata.MD
	_, err := f.client().UnaryCall(ctx, request("a"), grpc.Trailer(&trailer))
	wantRefusal(t, err, codes.Aborted, "IN_FLIGHT", true)
	if got := trailer.Get("retry-after"); len(got) != 1 || got[0] != "2" {
		t.Errorf("retry-after trailer = %q, want [2]", got)
	}
	close(svc.block)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	if n := svc.eff.count("a"); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}

func TestStoreUnavailable(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	store.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("store down")})
	f := newFixture(t, fixtureOptions{store: store})
	_, err := f.client().UnaryCall(withKey(testContext(t), "k"), request("a"))
	wantRefusal(t, err, codes.Unavailable, "STORE_UNAVAILABLE", true)
	if n := f.svc.eff.count("a"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}

// abandoning is a Store whose first acquiring Claim reports that it took
// over from an abandoned holder, as a store does after the holder's
// process died.
type abandoning struct {
	engine.Store
	once sync.Once
}

func (s *abandoning) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if err == nil && c.Status == engine.Acquired {
		s.once.Do(func() { c.Abandoned = 1 })
	}
	return c, err
}

// TestOutcomeUnknown: under RefuseAbandoned, a takeover is answered
// DataLoss, stored and replayed, and the client does not retry it.
func TestOutcomeUnknown(t *testing.T) {
	f := newFixture(t, fixtureOptions{cfg: engine.Config{Abandoned: engine.RefuseAbandoned},
		store:  &abandoning{Store: teststores.Memory(t)},
		client: clientInterceptor(t, idemgrpc.WithBackoff(0, 0)),
	})
	ctx := withKey(testContext(t), "k")
	for i, wantReplay := range []bool{false, true} {
		var rep idemgrpc.Report
		_, err := f.client().UnaryCall(ctx, request("a"), idemgrpc.WithReport(&rep))
		wantRefusal(t, err, codes.DataLoss, "OUTCOME_UNKNOWN", false)
		if rep.Attempts != 1 || rep.Replayed != wantReplay {
			t.Errorf("call %d: attempts = %d, replayed = %v; want 1, %v", i, rep.Attempts, rep.Replayed, wantReplay)
		}
	}
	if n := f.svc.eff.count("a"); n != 0 {
		t.Errorf("executions = %d, want 0", n)
	}
}

// TestStoredError: a handler's error that does not mean "retry" is stored
// and replayed, with its code and message.
func TestStoredError(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t)})
	ctx := withKey(testContext(t), "k")
	for i, replay := range []bool{false, true} {
		var header metadata.MD
		_, err := f.client().UnaryCall(ctx, failing("a", codes.NotFound, "no such order"), grpc.Header(&header))
		if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != "no such order" {
			t.Fatalf("call %d: %v, want NotFound: no such order", i, err)
		}
		if idemgrpc.Replayed(header) != replay {
			t.Errorf("call %d: Replayed = %v, want %v", i, idemgrpc.Replayed(header), replay)
		}
	}
	if n := f.svc.eff.count("a"); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}

// TestReleasedError: a handler's error that means "retry" releases the key.
func TestReleasedError(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded} {
		t.Run(code.String(), func(t *testing.T) {
			f := newFixture(t, fixtureOptions{store: teststores.Memory(t)})
			ctx := withKey(testContext(t), "k")
			for range 2 {
				if _, err := f.client().UnaryCall(ctx, failing("a", code, "try again")); status.Code(err) != code {
					t.Fatalf("%v, want %v", err, code)
				}
			}
			if n := f.svc.eff.count("a"); n != 2 {
				t.Errorf("executions = %d, want 2", n)
			}
		})
	}
}

// TestReplay: a replay has the first answer's message, header and trailer,
// and idempotent-replayed: true.
func TestReplay(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t)})
	ctx := withKey(testContext(t), "k")
	for i, replay := range []bool{false, true} {
		var header, trailer metadata.MD
		resp, err := f.client().UnaryCall(ctx, request("a"), grpc.Header(&header), grpc.Trailer(&trailer))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetUsername() != "1" || string(resp.GetPayload().GetBody()) != "a" {
			t.Errorf("call %d: answer %v, want the first's", i, resp)
		}
		if got := header.Get("x-run"); len(got) != 1 || got[0] != "1" {
			t.Errorf("call %d: x-run = %q, want [1]", i, got)
		}
		if got := trailer.Get("x-trailer"); len(got) != 1 || got[0] != "t" {
			t.Errorf("call %d: x-trailer = %q, want [t]", i, got)
		}
		if idemgrpc.Replayed(header) != replay {
			t.Errorf("call %d: Replayed = %v, want %v", i, idemgrpc.Replayed(header), replay)
		}
	}
}

// unstorable is a Store that refuses every response with a body, as a
// store does with one larger than a record can hold.
type unstorable struct{ engine.Store }

func (s unstorable) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if len(resp.Body) > 0 {
		return fmt.Errorf("too large: %w", engine.ErrNotStorable)
	}
	return s.Store.Complete(ctx, id, token, resp, ttl)
}

// TestResponseOmitted: an answer the store cannot keep is sent, the call
// is recorded without it, and a retry gets DataLoss, not a second run.
func TestResponseOmitted(t *testing.T) {
	f := newFixture(t, fixtureOptions{store: unstorable{teststores.Memory(t)}})
	ctx := withKey(testContext(t), "k")
	if _, err := f.client().UnaryCall(ctx, request("a")); err != nil {
		t.Fatal(err)
	}
	_, err := f.client().UnaryCall(ctx, request("a"))
	wantRefusal(t, err, codes.DataLoss, "RESPONSE_OMITTED", false)
	// A stored error keeps its code.
	ctx = withKey(testContext(t), "k2")
	for range 2 {
		if _, err := f.client().UnaryCall(ctx, failing("b", codes.NotFound, "gone")); status.Code(err) != codes.NotFound {
			t.Fatalf("%v, want NotFound", err)
		}
	}
	if a, b := f.svc.eff.count("a"), f.svc.eff.count("b"); a != 1 || b != 1 {
		t.Errorf("executions = %d, %d, want 1, 1", a, b)
	}
}

// TestFailOpen: with Config.FailOpen, a failing store lets the call run
// unprotected.
func TestFailOpen(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	store.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("store down")})
	f := newFixture(t, fixtureOptions{cfg: engine.Config{FailOpen: true}, store: store})
	if _, err := f.client().UnaryCall(withKey(testContext(t), "k"), request("a")); err != nil {
		t.Fatal(err)
	}
	if n := f.svc.eff.count("a"); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}

// TestConcurrentAttempts: attempts of one call that arrive together run
// the handler once; the others are refused in flight, retry, and get the
// answer replayed.
func TestConcurrentAttempts(t *testing.T) {
	svc := &service{eff: newEffects(), block: make(chan struct{}), started: make(chan struct{}, 1)}
	f := newFixture(t, fixtureOptions{cfg: engine.Config{RetryAfter: 10 * time.Millisecond}, store: teststores.Memory(t), svc: svc,
		client: clientInterceptor(t, idemgrpc.WithMaxAttempts(1000), idemgrpc.WithBackoff(time.Millisecond, 5*time.Millisecond))})
	ctx := withKey(testContext(t), "k")
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			resp, err := f.client().UnaryCall(ctx, request("a"))
			if err == nil && resp.GetUsername() != "1" {
				err = fmt.Errorf("answer from run %s, want 1", resp.GetUsername())
			}
			errs <- err
		})
	}
	<-svc.started
	close(svc.block)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := svc.eff.count("a"); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
}

// recoverer is a recovery interceptor, as servers put outside the others.
func recoverer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

// TestHandlerPanic: a handler's panic goes on to the recovery interceptor,
// and the key is released: the retry runs the handler again.
func TestHandlerPanic(t *testing.T) {
	svc := &service{eff: newEffects(), panicFirst: true}
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), svc: svc, outer: recoverer})
	ctx := withKey(testContext(t), "k")
	if _, err := f.client().UnaryCall(ctx, request("a")); status.Code(err) != codes.Internal {
		t.Fatalf("%v, want Internal from the recovery interceptor", err)
	}
	resp, err := f.client().UnaryCall(ctx, request("a"))
	if err != nil || resp.GetUsername() != "2" {
		t.Fatalf("retry: %v, %v; want the second run's answer", resp, err)
	}
}

// TestObserverPanics: an observer that panics on every event changes no
// answer and leaves no key claimed: the call runs once and its retry is
// replayed.
func TestObserverPanics(t *testing.T) {
	f := newFixture(t, fixtureOptions{cfg: engine.Config{Observer: func(context.Context, engine.Event) { panic("observer") }}, store: teststores.Memory(t), serverOpts: []idemgrpc.Option{}})
	for range 2 {
		if _, err := f.client().UnaryCall(withKey(testContext(t), "k"), request("a")); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.svc.eff.count("a"); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}

// TestKeep: WithKeep decides which error codes are kept: here NotFound is
// released, so that the retry runs the handler again, and Unavailable,
// released by default, is kept and replayed. A keep function that panics is
// recovered, logged once, and the default decides.
func TestKeep(t *testing.T) {
	t.Run("chosen", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
			idemgrpc.WithKeep(func(c codes.Code) bool { return c != codes.NotFound }),
		}})
		for i, req := range []*testgrpc.SimpleRequest{failing("nf", codes.NotFound, "gone"), failing("un", codes.Unavailable, "busy")} {
			ctx := withKey(testContext(t), fmt.Sprintf("k-%d", i))
			for range 2 {
				if _, err := f.client().UnaryCall(ctx, req); status.Code(err) != codes.Code(req.GetResponseStatus().GetCode()) {
					t.Fatalf("%v, want %v", err, codes.Code(req.GetResponseStatus().GetCode()))
				}
			}
		}
		if nf, un := f.svc.eff.count("nf"), f.svc.eff.count("un"); nf != 2 || un != 1 {
			t.Errorf("executions = NotFound %d, Unavailable %d; want 2 (released), 1 (kept)", nf, un)
		}
	})
	t.Run("panics", func(t *testing.T) {
		var logs syncBuffer
		f := newFixture(t, fixtureOptions{cfg: engine.Config{Logger: logTo(&logs)}, store: teststores.Memory(t), serverOpts: []idemgrpc.Option{
			idemgrpc.WithKeep(func(codes.Code) bool { panic("keep") }),
		}})
		for i, req := range []*testgrpc.SimpleRequest{failing("nf", codes.NotFound, "gone"), failing("un", codes.Unavailable, "busy")} {
			ctx := withKey(testContext(t), fmt.Sprintf("k-%d", i))
			for range 2 {
				if _, err := f.client().UnaryCall(ctx, req); status.Code(err) != codes.Code(req.GetResponseStatus().GetCode()) {
					t.Fatalf("%v, want %v", err, codes.Code(req.GetResponseStatus().GetCode()))
				}
			}
		}
		if nf, un := f.svc.eff.count("nf"), f.svc.eff.count("un"); nf != 1 || un != 2 {
			t.Errorf("executions = NotFound %d, Unavailable %d; want 1 (kept by default), 2 (released by default)", nf, un)
		}
		if n := strings.Count(logs.String(), "keep function panicked"); n != 1 {
			t.Errorf("logged %d times, want once; log:\n%s", n, logs.String())
		}
	})
}

// loggingStream is a ServerTransportStream that an outer interceptor puts
// in the call's context, as a logging interceptor does, and that records
// the header metadata set through it.
type loggingStream struct {
	grpc.ServerTransportStream
	mu     sync.Mutex
	header metadata.MD
}

func (l *loggingStream) SetHeader(md metadata.MD) error {
	l.mu.Lock()
	l.header = metadata.Join(l.header, md)
	l.mu.Unlock()
	return l.ServerTransportStream.SetHeader(md)
}

// TestOuterStream: an interceptor before the Server's wraps the call's
// transport stream. The handler's header and trailer, and a replay's, go
// through the wrapper and reach the client; the replay's carry the mark.
func TestOuterStream(t *testing.T) {
	var (
		mu      sync.Mutex
		streams []*loggingStream
	)
	outer := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		l := &loggingStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx)}
		mu.Lock()
		streams = append(streams, l)
		mu.Unlock()
		return handler(grpc.NewContextWithServerTransportStream(ctx, l), req)
	}
	f := newFixture(t, fixtureOptions{store: teststores.Memory(t), outer: outer})
	ctx := withKey(testContext(t), "k")
	for i, replay := range []bool{false, true} {
		var header, trailer metadata.MD
		resp, err := f.client().UnaryCall(ctx, request("a"), grpc.Header(&header), grpc.Trailer(&trailer))
		if err != nil || resp.GetUsername() != "1" {
			t.Fatalf("call %d: %v, %v; want the first run's answer", i, resp, err)
		}
		if idemgrpc.Replayed(header) != replay || header.Get("x-run")[0] != "1" || len(trailer.Get("x-trailer")) != 1 {
			t.Errorf("call %d: header %v, trailer %v; want x-run 1, the trailer, replayed %v", i, header, trailer, replay)
		}
		mu.Lock()
		l := streams[len(streams)-1]
		mu.Unlock()
		l.mu.Lock()
		seen := l.header
		l.mu.Unlock()
		if len(seen.Get("x-run")) != 1 || idemgrpc.Replayed(seen) != replay {
			t.Errorf("call %d: the outer stream saw header %v, want x-run once, replayed %v", i, seen, replay)
		}
	}
	if n := f.svc.eff.count("a"); n != 1 {
		t.Errorf("executions = %d, want 1", n)
	}
}
