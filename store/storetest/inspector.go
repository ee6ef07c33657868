package storetest

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// The subtests in this file check engine.Inspector, and are skipped for a
// Store that does not implement it.

// clockSkew is how far the store's clock may be from this process's.
const clockSkew = time.Minute

// inspector returns the fixture's Store as an Inspector, or skips.
func (f fixture) inspector(t *testing.T) engine.Inspector {
	t.Helper()
	in, ok := f.store.(engine.Inspector)
	if !ok {
		t.Skipf("%T does not implement engine.Inspector", f.store)
	}
	return in
}

func (f fixture) lookup(t *testing.T, in engine.Inspector, id engine.ID) engine.Record {
	t.Helper()
	r, err := in.Lookup(f.ctx, id)
	if err != nil {
		t.Fatalf("Lookup(%v) error = %v", id, err)
	}
	if r.ID != id {
		t.Errorf("Lookup(%v) ID = %v", id, r.ID)
	}
	return r
}

func resolvedResponse() *engine.Response {
	return &engine.Response{
		Status: http.StatusOK,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"resolved":true}`),
	}
}

// assertNear checks that got is within slack of want.
func assertNear(t *testing.T, what string, got, want time.Time, slack time.Duration) {
	t.Helper()
	if d := got.Sub(want); d < -slack || d > slack {
		t.Errorf("%s = %v, want %v within %v", what, got, want, slack)
	}
}

// assertSpan checks that end - start is within [min, max].
func assertSpan(t *testing.T, what string, start, end time.Time, lo, hi time.Duration) {
	t.Helper()
	if d := end.Sub(start); d < lo || d > hi {
		t.Errorf("%s = %v (from %v to %v), want within [%v, %v]", what, d, start, end, lo, hi)
	}
}

// awaitForgotten polls Lookup until the record for id is gone, which it
// must be within patience.
func (f fixture) awaitForgotten(t *testing.T, in engine.Inspector, id engine.ID) {
	t.Helper()
	for {
		_, err := in.Lookup(f.ctx, id)
		if errors.Is(err, engine.ErrNotFound) {
			return
		}
		if err != nil {
			t.Fatalf("Lookup of an expiring record error = %v", err)
		}
		select {
		case <-f.ctx.Done():
			t.Fatalf("Lookup of a record past its TTL still finds it after %v", patience)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func testLookupNotFound(t *testing.T, f fixture) {
	in := f.inspector(t)
	for _, tc := range []struct {
		name  string
		setup func(id engine.ID)
	}{
		{"never claimed", func(engine.ID) {}},
		{"released", func(id engine.ID) {
			tok := f.acquire(t, id, "fp", longLease, longTTL)
			if err := f.store.Release(f.ctx, id, tok); err != nil {
				t.Fatalf("Release error = %v", err)
			}
		}},
	} {
		id := f.id("lookup-none-" + tc.name)
		tc.setup(id)
		if _, err := in.Lookup(f.ctx, id); !errors.Is(err, engine.ErrNotFound) {
			t.Errorf("Lookup of a key %s error = %v, want ErrNotFound", tc.name, err)
		}
		// Looking did not make a record.
		if c := f.claim(t, id, "fp-other", longLease, longTTL); c.Status != engine.Acquired || c.Abandoned != 0 {
			t.Errorf("Claim after Lookup of a key %s = %v, Abandoned %d; want acquired, 0", tc.name, c.Status, c.Abandoned)
		}
	}

	// An expired record is not found either.
	id := f.id("lookup-expired")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), shortTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	f.awaitForgotten(t, in, id)
}

func testLookupInFlight(t *testing.T, f fixture) {
	in := f.inspector(t)
	id := f.id("lookup-inflight")
	first := f.claim(t, id, "fp", shortLease, longTTL)
	if first.Status != engine.Acquired {
		t.Fatalf("Claim status = %v, want acquired", first.Status)
	}
	r := f.lookup(t, in, id)
	if r.Completed || r.Response != nil {
		t.Errorf("Lookup of a record in flight Completed = %v, Response = %v; want false, nil", r.Completed, r.Response)
	}
	if r.Fingerprint != "fp" || r.Token != first.Token || r.Abandoned != 0 {
		t.Errorf("Lookup = fingerprint %q, token %d, Abandoned %d; want %q, %d, 0", r.Fingerprint, r.Token, r.Abandoned, "fp", first.Token)
	}
	assertNear(t, "Created", r.Created, time.Now(), clockSkew)
	assertSpan(t, "lease", r.Created, r.LeaseEnds, shortLease-time.Second, shortLease+time.Second)
	assertSpan(t, "life", r.Created, r.Expires, longTTL-time.Second, longTTL+time.Second)
	created := r.Created

	// A takeover: the new holder's token and lease, the count, and the
	// first claim's time.
	next := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	r = f.lookup(t, in, id)
	if r.Completed || r.Token != next.Token || r.Abandoned != 1 {
		t.Errorf("Lookup after a takeover = completed %v, token %d, Abandoned %d; want false, %d, 1", r.Completed, r.Token, r.Abandoned, next.Token)
	}
	if !r.Created.Equal(created) {
		t.Errorf("Lookup after a takeover Created = %v, want the first claim's %v", r.Created, created)
	}
	assertSpan(t, "lease after a takeover", r.Created, r.LeaseEnds, longLease-time.Second, longLease+patience)

	// Looking changes nothing: the holder still completes.
	if err := f.store.Complete(f.ctx, id, next.Token, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete after Lookup error = %v", err)
	}
}

func testLookupCompleted(t *testing.T, f fixture) {
	in := f.inspector(t)
	id := f.id("lookup-completed")
	f.acquire(t, id, "fp", shortLease, longTTL)
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	want := sampleResponse()
	const ttl = 2 * longTTL
	if err := f.store.Complete(f.ctx, id, c.Token, want, ttl); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	r := f.lookup(t, in, id)
	if !r.Completed {
		t.Fatalf("Lookup of a completed record Completed = false")
	}
	assertResponse(t, r.Response, want)
	// Complete keeps the count of abandoned holders.
	if r.Fingerprint != "fp" || r.Token != c.Token || r.Abandoned != 1 {
		t.Errorf("Lookup = fingerprint %q, token %d, Abandoned %d; want %q, %d, 1", r.Fingerprint, r.Token, r.Abandoned, "fp", c.Token)
	}
	assertNear(t, "Created", r.Created, time.Now(), clockSkew)
	// The record expires ttl after its completion, which came after its
	// first claim.
	assertSpan(t, "life", r.Created, r.Expires, ttl-time.Second, ttl+patience)
}

func testResolveWithResponse(t *testing.T, f fixture) {
	in := f.inspector(t)
	want := resolvedResponse()

	// A holder still running, one whose lease ran out, and a record
	// already completed: each is settled, and its holder refused.
	live, lost, done := f.id("resolve-live"), f.id("resolve-lost"), f.id("resolve-done")
	tokens := map[engine.ID]engine.Token{
		live: f.acquire(t, live, "fp", longLease, longTTL),
		lost: f.acquire(t, lost, "fp", shortLease, longTTL),
		done: f.acquire(t, done, "fp", longLease, longTTL),
	}
	if err := f.store.Complete(f.ctx, done, tokens[done], sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	// The lease of lost has run out once a probe's, taken at the same
	// time, can be taken over.
	probe := f.id("resolve-lost-probe")
	f.acquire(t, probe, "fp", shortLease, longTTL)
	f.awaitAcquired(t, probe, "fp", longLease, longTTL)

	for _, id := range []engine.ID{live, lost, done} {
		if err := in.Resolve(f.ctx, id, want, longTTL); err != nil {
			t.Fatalf("Resolve(%s) error = %v", id.Key, err)
		}
		for _, fp := range []string{"fp", "fp-other"} {
			c := f.claim(t, id, fp, longLease, longTTL)
			if c.Status != engine.Completed || c.Fingerprint != "fp" {
				t.Fatalf("Claim(%s, %s) after Resolve = %v %q, want completed %q", id.Key, fp, c.Status, c.Fingerprint, "fp")
			}
			assertResponse(t, c.Response, want)
		}
		r := f.lookup(t, in, id)
		if !r.Completed {
			t.Errorf("Lookup(%s) after Resolve Completed = false", id.Key)
		}
		assertResponse(t, r.Response, want)
		tok := tokens[id]
		if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), longTTL); !errors.Is(err, engine.ErrLeaseLost) {
			t.Errorf("Complete(%s) by the holder after Resolve error = %v, want ErrLeaseLost", id.Key, err)
		}
		if err := f.store.Extend(f.ctx, id, tok, longLease); !errors.Is(err, engine.ErrLeaseLost) {
			t.Errorf("Extend(%s) by the holder after Resolve error = %v, want ErrLeaseLost", id.Key, err)
		}
		if err := f.store.Release(f.ctx, id, tok); !errors.Is(err, engine.ErrLeaseLost) {
			t.Errorf("Release(%s) by the holder after Resolve error = %v, want ErrLeaseLost", id.Key, err)
		}
		// The refused calls changed nothing.
		assertResponse(t, f.claim(t, id, "fp", longLease, longTTL).Response, want)
	}
}

func testResolveTTL(t *testing.T, f fixture) {
	in := f.inspector(t)
	id := f.id("resolve-ttl")
	f.acquire(t, id, "fp", longLease, longTTL)
	if err := in.Resolve(f.ctx, id, resolvedResponse(), shortTTL); err != nil {
		t.Fatalf("Resolve error = %v", err)
	}
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.Completed {
		t.Fatalf("Claim before the TTL status = %v, want completed", c.Status)
	}
	// The record is forgotten after the TTL that Resolve gave.
	c := f.awaitAcquired(t, id, "fp-new", longLease, longTTL)
	if c.Abandoned != 0 {
		t.Errorf("Claim after the resolved record expired Abandoned = %d, want 0", c.Abandoned)
	}
}

func testResolveForget(t *testing.T, f fixture) {
	in := f.inspector(t)
	// In flight, after a takeover, so that there is a count to forget.
	id := f.id("forget-inflight")
	f.acquire(t, id, "fp", shortLease, longTTL)
	held := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if err := in.Resolve(f.ctx, id, nil, longTTL); err != nil {
		t.Fatalf("Resolve(nil) error = %v", err)
	}
	if _, err := in.Lookup(f.ctx, id); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("Lookup after Resolve(nil) error = %v, want ErrNotFound", err)
	}
	if err := f.store.Complete(f.ctx, id, held.Token, sampleResponse(), longTTL); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Complete by the holder of a forgotten record error = %v, want ErrLeaseLost", err)
	}
	// The key runs again, as new, with another fingerprint even.
	c := f.claim(t, id, "fp-other", longLease, longTTL)
	if c.Status != engine.Acquired || c.Abandoned != 0 {
		t.Fatalf("Claim after Resolve(nil) = %v, Abandoned %d; want acquired, 0", c.Status, c.Abandoned)
	}
	if c.Token <= held.Token {
		t.Errorf("token after Resolve(nil) = %d, want > %d", c.Token, held.Token)
	}
	for _, err := range []error{
		f.store.Complete(f.ctx, id, held.Token, sampleResponse(), longTTL),
		f.store.Extend(f.ctx, id, held.Token, longLease),
		f.store.Release(f.ctx, id, held.Token),
	} {
		if !errors.Is(err, engine.ErrLeaseLost) {
			t.Errorf("call by the holder of a forgotten record error = %v, want ErrLeaseLost", err)
		}
	}
	if err := f.store.Complete(f.ctx, id, c.Token, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete by the new holder error = %v", err)
	}

	// Completed: forgotten too.
	if err := in.Resolve(f.ctx, id, nil, longTTL); err != nil {
		t.Fatalf("Resolve(nil) of a completed record error = %v", err)
	}
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.Acquired || c.Abandoned != 0 {
		t.Fatalf("Claim after Resolve(nil) of a completed record = %v, Abandoned %d; want acquired, 0", c.Status, c.Abandoned)
	}
}

func testResolveNotFound(t *testing.T, f fixture) {
	in := f.inspector(t)
	released := f.id("resolve-released")
	tok := f.acquire(t, released, "fp", longLease, longTTL)
	if err := f.store.Release(f.ctx, released, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	expired := f.id("resolve-expired")
	tok = f.acquire(t, expired, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, expired, tok, sampleResponse(), shortTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	f.awaitForgotten(t, in, expired)
	for _, id := range []engine.ID{f.id("resolve-never-claimed"), released, expired} {
		for _, resp := range []*engine.Response{resolvedResponse(), nil} {
			if err := in.Resolve(f.ctx, id, resp, longTTL); !errors.Is(err, engine.ErrNotFound) {
				t.Errorf("Resolve(%s, response %v) error = %v, want ErrNotFound", id.Key, resp != nil, err)
			}
		}
		// Nothing was made.
		if _, err := in.Lookup(f.ctx, id); !errors.Is(err, engine.ErrNotFound) {
			t.Errorf("Lookup(%s) after Resolve error = %v, want ErrNotFound", id.Key, err)
		}
		if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.Acquired {
			t.Errorf("Claim(%s) after Resolve status = %v, want acquired", id.Key, c.Status)
		}
	}
}
