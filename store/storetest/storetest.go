// Package storetest is the conformance suite for engine.Store
// implementations.
//
// Run checks one property per named subtest, each against a Store from the
// constructor and with keys of its own, so that a Store backed by a shared
// database can be tested without cleaning it between subtests. The subtests
// run in parallel. Run it with -race: several properties are about
// concurrency.
//
// The suite waits for leases and TTLs of a few hundred milliseconds, and a
// second, to pass, using the Store's own clock (a database's, for instance),
// so it takes a few seconds.
//
// Besides the Store's methods, the suite checks Claim.Abandoned (how many
// holders lost their lease before a takeover, kept when a later holder
// releases the record), that an in-flight record outlives its lease by the
// TTL (after a Claim and after an Extend), leases and TTLs at both ends of
// their range (1ns and math.MaxInt64), and, for a Store that implements
// engine.Inspector, Lookup and Resolve, and for one that implements
// engine.StepStore, the steps: returned by a takeover's and a re-acquiring
// Claim, fenced by the token, kept by a release, dropped by a completion
// and a resolution, expiring with the record, limited in count and size;
// those subtests are skipped for a Store that does not.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// NewStore returns a Store for one subtest. It may return the same Store
// every time; Run gives every subtest keys of its own. Cleanup, if any, is
// registered with t.Cleanup.
type NewStore func(t *testing.T) engine.Store

const (
	// shortLease and shortTTL are what the subtests wait out.
	shortLease = 150 * time.Millisecond
	shortTTL   = 300 * time.Millisecond
	longLease  = time.Minute
	longTTL    = time.Hour
	// patience bounds every wait for a lease or TTL to pass, and each
	// subtest as a whole.
	patience = 20 * time.Second
)

// Run runs the conformance suite against the stores that newStore returns.
func Run(t *testing.T, newStore NewStore) {
	t.Helper()
	for _, tc := range append([]struct {
		name string
		fn   func(t *testing.T, f fixture)
	}{
		{"ClaimNew", testClaimNew},
		{"ReplayCompleted", testReplayCompleted},
		{"InFlight", testInFlight},
		{"FingerprintMismatchVisible", testFingerprintMismatchVisible},
		{"Release", testRelease},
		{"StaleTokenRefused", testStaleTokenRefused},
		{"LeaseExpiryAndTakeover", testLeaseExpiryAndTakeover},
		{"ExpiredLeaseOtherFingerprint", testExpiredLeaseOtherFingerprint},
		{"Extend", testExtend},
		{"TTLExpiry", testTTLExpiry},
		{"ScopesAreSeparate", testScopesAreSeparate},
		{"ConcurrentClaimers", testConcurrentClaimers},
		{"BinaryRoundTrip", testBinaryRoundTrip},
		{"LargeBody", testLargeBody},
		{"ContextCancellation", testContextCancellation},
		{"AbandonedZeroWhenNew", testAbandonedZeroWhenNew},
		{"TakeoverCountsAbandoned", testTakeoverCountsAbandoned},
		{"ReleaseKeepsAbandoned", testReleaseKeepsAbandoned},
		{"RecordOutlivesLease", testRecordOutlivesLease},
		{"ExtendKeepsAbandoned", testExtendKeepsAbandoned},
		{"MaxTTL", testMaxTTL},
		{"MaxLease", testMaxLease},
		{"TinyDurations", testTinyDurations},
		{"LookupNotFound", testLookupNotFound},
		{"LookupInFlight", testLookupInFlight},
		{"LookupCompleted", testLookupCompleted},
		{"ResolveWithResponse", testResolveWithResponse},
		{"ResolveTTL", testResolveTTL},
		{"ResolveForget", testResolveForget},
		{"ResolveNotFound", testResolveNotFound},
	}, stepCases...) {
		t.Run(tc.name, func(t *testing.T) {
			// Every subtest has keys of its own, and a Store must be
			// safe for concurrent use: they run side by side, which
			// also makes the suite's waits for leases overlap.
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			tc.fn(t, fixture{ctx: ctx, store: newStore(t), prefix: randomString(t, 8)})
		})
	}
}

type fixture struct {
	ctx    context.Context
	store  engine.Store
	prefix string
}

// id returns an ID that no other subtest or run uses.
func (f fixture) id(name string) engine.ID {
	return engine.ID{Scope: "storetest/" + f.prefix, Key: name}
}

func (f fixture) claim(t *testing.T, id engine.ID, fp string, lease, ttl time.Duration) engine.Claim {
	t.Helper()
	c, err := f.store.Claim(f.ctx, id, fp, lease, ttl)
	if err != nil {
		t.Fatalf("Claim(%v) error = %v", id, err)
	}
	return c
}

func (f fixture) acquire(t *testing.T, id engine.ID, fp string, lease, ttl time.Duration) engine.Token {
	t.Helper()
	c := f.claim(t, id, fp, lease, ttl)
	if c.Status != engine.Acquired {
		t.Fatalf("Claim(%v) status = %v, want acquired", id, c.Status)
	}
	return c.Token
}

// awaitAcquired claims id until the store grants a lease, which it must do
// within patience.
func (f fixture) awaitAcquired(t *testing.T, id engine.ID, fp string, lease, ttl time.Duration) engine.Claim {
	t.Helper()
	for {
		c := f.claim(t, id, fp, lease, ttl)
		if c.Status == engine.Acquired {
			return c
		}
		select {
		case <-f.ctx.Done():
			t.Fatalf("Claim(%v) status = %v after %v, want acquired", id, c.Status, patience)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func sampleResponse() *engine.Response {
	return &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:   []byte(`{"id":1}`),
	}
}

func testClaimNew(t *testing.T, f fixture) {
	c := f.claim(t, f.id("new"), "fp", longLease, longTTL)
	if c.Status != engine.Acquired {
		t.Fatalf("Claim status = %v, want acquired", c.Status)
	}
	if c.Token <= 0 {
		t.Errorf("Claim token = %d, want > 0", c.Token)
	}
}

func testReplayCompleted(t *testing.T, f fixture) {
	id := f.id("replay")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	want := sampleResponse()
	if err := f.store.Complete(f.ctx, id, tok, want, longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	for range 2 {
		c := f.claim(t, id, "fp", longLease, longTTL)
		if c.Status != engine.Completed {
			t.Fatalf("Claim after Complete status = %v, want completed", c.Status)
		}
		if c.Fingerprint != "fp" {
			t.Errorf("Claim fingerprint = %q, want %q", c.Fingerprint, "fp")
		}
		assertResponse(t, c.Response, want)
	}
	if err := f.store.Complete(f.ctx, id, tok, want, longTTL); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("second Complete error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Release(f.ctx, id, tok); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Release after Complete error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Extend(f.ctx, id, tok, longLease); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Extend after Complete error = %v, want ErrLeaseLost", err)
	}
}

func testInFlight(t *testing.T, f fixture) {
	id := f.id("inflight")
	f.acquire(t, id, "fp", longLease, longTTL)
	c := f.claim(t, id, "fp", longLease, longTTL)
	if c.Status != engine.InFlight {
		t.Fatalf("second Claim status = %v, want in flight", c.Status)
	}
	if c.Fingerprint != "fp" {
		t.Errorf("second Claim fingerprint = %q, want %q", c.Fingerprint, "fp")
	}
	if c.RetryAfter <= 0 || c.RetryAfter > longLease {
		t.Errorf("second Claim RetryAfter = %v, want in (0, %v]", c.RetryAfter, longLease)
	}
}

func testFingerprintMismatchVisible(t *testing.T, f fixture) {
	id := f.id("mismatch")
	tok := f.acquire(t, id, "fp-a", longLease, longTTL)
	c := f.claim(t, id, "fp-b", longLease, longTTL)
	if c.Status != engine.InFlight || c.Fingerprint != "fp-a" {
		t.Fatalf("in-flight Claim with another fingerprint = %v %q, want in flight %q", c.Status, c.Fingerprint, "fp-a")
	}
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	c = f.claim(t, id, "fp-b", longLease, longTTL)
	if c.Status != engine.Completed || c.Fingerprint != "fp-a" {
		t.Fatalf("completed Claim with another fingerprint = %v %q, want completed %q", c.Status, c.Fingerprint, "fp-a")
	}
}

func testRelease(t *testing.T, f fixture) {
	id := f.id("release")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	tok2 := f.acquire(t, id, "fp", longLease, longTTL)
	if tok2 <= tok {
		t.Errorf("token after Release = %d, want > %d", tok2, tok)
	}
	// A released key may be claimed with another fingerprint: nothing ran.
	if err := f.store.Release(f.ctx, id, tok2); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	f.acquire(t, id, "fp-other", longLease, longTTL)
}

func testStaleTokenRefused(t *testing.T, f fixture) {
	id := f.id("stale")
	old := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Release(f.ctx, id, old); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	cur := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, id, old, sampleResponse(), longTTL); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Complete with stale token error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Release(f.ctx, id, old); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Release with stale token error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Extend(f.ctx, id, old, longLease); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Extend with stale token error = %v, want ErrLeaseLost", err)
	}
	// The stale calls changed nothing: the record is still in flight, held
	// by the current token.
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.InFlight {
		t.Fatalf("Claim after stale calls status = %v, want in flight", c.Status)
	}
	if err := f.store.Complete(f.ctx, id, cur, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete with current token error = %v", err)
	}
	unknown := f.id("never-claimed")
	if err := f.store.Complete(f.ctx, unknown, cur, sampleResponse(), longTTL); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Complete of an unknown ID error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Release(f.ctx, unknown, cur); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Release of an unknown ID error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Extend(f.ctx, unknown, cur, longLease); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Extend of an unknown ID error = %v, want ErrLeaseLost", err)
	}
}

func testLeaseExpiryAndTakeover(t *testing.T, f fixture) {
	id := f.id("takeover")
	old := f.acquire(t, id, "fp", shortLease, longTTL)
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if c.Token <= old {
		t.Errorf("takeover token = %d, want > %d", c.Token, old)
	}
	if err := f.store.Complete(f.ctx, id, old, sampleResponse(), longTTL); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Complete by the holder that lost its lease error = %v, want ErrLeaseLost", err)
	}
	if err := f.store.Extend(f.ctx, id, old, longLease); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Extend by the holder that lost its lease error = %v, want ErrLeaseLost", err)
	}
	if got := f.claim(t, id, "fp", longLease, longTTL); got.Status != engine.InFlight {
		t.Fatalf("Claim after takeover status = %v, want in flight", got.Status)
	}
	if err := f.store.Complete(f.ctx, id, c.Token, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete by the new holder error = %v", err)
	}
}

func testExpiredLeaseOtherFingerprint(t *testing.T, f fixture) {
	id := f.id("expired-other")
	f.acquire(t, id, "fp-a", shortLease, longTTL)
	// Wait for the lease to expire, proven by a same-fingerprint claimer
	// being able to take over; then check a different fingerprint is
	// refused the next time round.
	id2 := f.id("expired-other-probe")
	f.acquire(t, id2, "fp-a", shortLease, longTTL)
	f.awaitAcquired(t, id2, "fp-a", longLease, longTTL)
	c := f.claim(t, id, "fp-b", longLease, longTTL)
	if c.Status != engine.InFlight || c.Fingerprint != "fp-a" {
		t.Fatalf("Claim of an expired lease with another fingerprint = %v %q, want in flight %q", c.Status, c.Fingerprint, "fp-a")
	}
	if c.RetryAfter != 0 {
		t.Errorf("Claim of an expired lease RetryAfter = %v, want 0", c.RetryAfter)
	}
	f.acquire(t, id, "fp-a", longLease, longTTL)
}

func testExtend(t *testing.T, f fixture) {
	id := f.id("extend")
	tok := f.acquire(t, id, "fp", shortLease, longTTL)
	if err := f.store.Extend(f.ctx, id, tok, longLease); err != nil {
		t.Fatalf("Extend error = %v", err)
	}
	c := f.claim(t, id, "fp", longLease, longTTL)
	if c.Status != engine.InFlight {
		t.Fatalf("Claim after Extend status = %v, want in flight", c.Status)
	}
	if c.RetryAfter <= longLease/2 {
		t.Errorf("Claim after Extend RetryAfter = %v, want about %v", c.RetryAfter, longLease)
	}
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete after Extend error = %v", err)
	}
}

func testTTLExpiry(t *testing.T, f fixture) {
	id := f.id("ttl")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), shortTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.Completed {
		t.Fatalf("Claim before the TTL status = %v, want completed", c.Status)
	}
	c := f.awaitAcquired(t, id, "fp-new", longLease, longTTL)
	if c.Token <= tok {
		t.Errorf("token after expiry = %d, want > %d", c.Token, tok)
	}
	// An abandoned in-flight record expires too.
	id2 := f.id("ttl-inflight")
	f.acquire(t, id2, "fp", shortLease, shortTTL)
	f.awaitAcquired(t, id2, "fp-new", longLease, longTTL)
}

func testScopesAreSeparate(t *testing.T, f fixture) {
	a := f.id("shared-key")
	b := engine.ID{Scope: a.Scope + "-other", Key: a.Key}
	tok := f.acquire(t, a, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, a, tok, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	f.acquire(t, b, "fp", longLease, longTTL)
}

func testConcurrentClaimers(t *testing.T, f fixture) {
	const claimers, rounds = 64, 10
	for round := range rounds {
		id := f.id("concurrent-" + string(rune('a'+round)))
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			mu       sync.Mutex
			acquired int
			errs     []error
		)
		for range claimers {
			wg.Go(func() {
				<-start
				c, err := f.store.Claim(f.ctx, id, "fp", longLease, longTTL)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case c.Status == engine.Acquired:
					acquired++
				case c.Status != engine.InFlight:
					errs = append(errs, errors.New("status "+c.Status.String()))
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %d of %d claimers failed, first: %v", round, len(errs), claimers, errs[0])
		}
		if acquired != 1 {
			t.Fatalf("round %d: %d of %d concurrent claimers acquired the lease, want exactly 1", round, acquired, claimers)
		}
	}
}

func testBinaryRoundTrip(t *testing.T, f fixture) {
	body := make([]byte, 512)
	for i := range body {
		body[i] = byte(i)
	}
	fp := string([]byte{0, 1, 2, 0xff, 0xfe, '"', '\\', '\n', 0x80})
	want := &engine.Response{
		Status: 299,
		Header: http.Header{
			"X-Binary":     {"\x00\x01\xff\xfe\"\\", ""},
			"X-Order":      {"z", "a", "m"},
			"X-Utf8":       {"naïve ✓"},
			"Content-Type": {"application/octet-stream"},
		},
		Body: body,
	}
	id := engine.ID{Scope: "storetest/" + f.prefix + " scope \"with\" spaces ✓", Key: `key with "quotes" \ and spaces`}
	tok := f.acquire(t, id, fp, longLease, longTTL)
	if err := f.store.Complete(f.ctx, id, tok, want, longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	c := f.claim(t, id, "other", longLease, longTTL)
	if c.Status != engine.Completed {
		t.Fatalf("Claim status = %v, want completed", c.Status)
	}
	if c.Fingerprint != fp {
		t.Errorf("fingerprint = %q, want %q", c.Fingerprint, fp)
	}
	assertResponse(t, c.Response, want)

	// An empty response and a body-omitted marker round-trip too.
	for i, want := range []*engine.Response{
		{Status: http.StatusNoContent},
		{Status: http.StatusCreated, Header: http.Header{"Location": {"/x"}}, BodyOmitted: true},
	} {
		id := f.id("binary-" + string(rune('a'+i)))
		tok := f.acquire(t, id, "fp", longLease, longTTL)
		if err := f.store.Complete(f.ctx, id, tok, want, longTTL); err != nil {
			t.Fatalf("Complete error = %v", err)
		}
		assertResponse(t, f.claim(t, id, "fp", longLease, longTTL).Response, want)
	}
}

func testLargeBody(t *testing.T, f fixture) {
	body := make([]byte, 4<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	want := &engine.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: body}
	id := f.id("large")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, id, tok, want, longTTL); err != nil {
		t.Fatalf("Complete of a 4 MiB body error = %v", err)
	}
	assertResponse(t, f.claim(t, id, "fp", longLease, longTTL).Response, want)
}

func testContextCancellation(t *testing.T, f fixture) {
	id := f.id("canceled")
	canceled, cancel := context.WithCancel(f.ctx)
	cancel()
	if _, err := f.store.Claim(canceled, id, "fp", longLease, longTTL); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a canceled context error = %v, want context.Canceled", err)
	}
	// Nothing was claimed.
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Complete(canceled, id, tok, sampleResponse(), longTTL); !errors.Is(err, context.Canceled) {
		t.Errorf("Complete with a canceled context error = %v, want context.Canceled", err)
	}
	if err := f.store.Extend(canceled, id, tok, longLease); !errors.Is(err, context.Canceled) {
		t.Errorf("Extend with a canceled context error = %v, want context.Canceled", err)
	}
	if err := f.store.Release(canceled, id, tok); !errors.Is(err, context.Canceled) {
		t.Errorf("Release with a canceled context error = %v, want context.Canceled", err)
	}
	// Nothing was completed or released either.
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.InFlight {
		t.Errorf("Claim after canceled calls status = %v, want in flight", c.Status)
	}
	expired, cancel2 := context.WithDeadline(f.ctx, time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := f.store.Claim(expired, f.id("deadline"), "fp", longLease, longTTL); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Claim past its deadline error = %v, want context.DeadlineExceeded", err)
	}
}

// assertResponse compares responses exactly: status, the flag, every header
// value in order, every body byte. nil and empty are the same.
func assertResponse(t *testing.T, got, want *engine.Response) {
	t.Helper()
	if got == nil {
		t.Fatalf("response = nil, want status %d", want.Status)
	}
	if got.Status != want.Status {
		t.Errorf("response status = %d, want %d", got.Status, want.Status)
	}
	if got.BodyOmitted != want.BodyOmitted {
		t.Errorf("response BodyOmitted = %v, want %v", got.BodyOmitted, want.BodyOmitted)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("response body differs: got %d bytes, want %d", len(got.Body), len(want.Body))
	}
	if len(got.Header) != len(want.Header) {
		t.Errorf("response has %d headers, want %d: %q", len(got.Header), len(want.Header), got.Header)
	}
	for k, vs := range want.Header {
		if g := got.Header[k]; !slices.Equal(g, vs) {
			t.Errorf("response header %q = %q, want %q", k, g, vs)
		}
	}
}

func randomString(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
