package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// The subtests in this file check Claim.Abandoned: how many holders lost
// their lease before the one that acquires it.

func testAbandonedZeroWhenNew(t *testing.T, f fixture) {
	id := f.id("abandoned-new")
	c := f.claim(t, id, "fp", longLease, longTTL)
	if c.Status != engine.Acquired || c.Abandoned != 0 {
		t.Fatalf("Claim of a new key = %v, Abandoned %d; want acquired, 0", c.Status, c.Abandoned)
	}
	if err := f.store.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.Acquired || c.Abandoned != 0 {
		t.Fatalf("Claim after Release = %v, Abandoned %d; want acquired, 0", c.Status, c.Abandoned)
	}
}

func testTakeoverCountsAbandoned(t *testing.T, f fixture) {
	id := f.id("abandoned-count")
	tok := f.acquire(t, id, "fp", shortLease, longTTL)
	for want := 1; want <= 2; want++ {
		c := f.awaitAcquired(t, id, "fp", shortLease, longTTL)
		if c.Abandoned != want {
			t.Fatalf("takeover %d Abandoned = %d, want %d", want, c.Abandoned, want)
		}
		if c.Token <= tok {
			t.Fatalf("takeover %d token = %d, want > %d", want, c.Token, tok)
		}
		tok = c.Token
	}
}

func testReleaseKeepsAbandoned(t *testing.T, f fixture) {
	id := f.id("abandoned-release")
	f.acquire(t, id, "fp", shortLease, longTTL)
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if c.Abandoned != 1 {
		t.Fatalf("takeover Abandoned = %d, want 1", c.Abandoned)
	}
	if err := f.store.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	// The releaser is fenced off, as after any release.
	for op, err := range map[string]error{
		"Complete": f.store.Complete(f.ctx, id, c.Token, sampleResponse(), longTTL),
		"Extend":   f.store.Extend(f.ctx, id, c.Token, longLease),
		"Release":  f.store.Release(f.ctx, id, c.Token),
	} {
		if !errors.Is(err, engine.ErrLeaseLost) {
			t.Errorf("%s by the holder that released error = %v, want ErrLeaseLost", op, err)
		}
	}
	// The lost holder may have run the request: the key is not new again.
	// Another request with it is refused, as before the takeover.
	if o := f.claim(t, id, "fp-other", longLease, longTTL); o.Status != engine.InFlight || o.Fingerprint != "fp" || o.RetryAfter != 0 {
		t.Errorf("Claim with another fingerprint after Release = %v %q RetryAfter %v; want in flight %q, 0", o.Status, o.Fingerprint, o.RetryAfter, "fp")
	}
	if in, ok := f.store.(engine.Inspector); ok {
		// As the takeover found it: in flight, its holder lost.
		r := f.lookup(t, in, id)
		if r.Completed || r.Abandoned != c.Abandoned-1 || r.Token == c.Token || r.Fingerprint != "fp" || !r.LeaseEnds.Before(r.Expires) {
			t.Errorf("Lookup after Release = completed %v, Abandoned %d, token %d, fingerprint %q, lease ends %v, expires %v; want in flight, %d, not %d, %q, before the expiry",
				r.Completed, r.Abandoned, r.Token, r.Fingerprint, r.LeaseEnds, r.Expires, c.Abandoned-1, c.Token, "fp")
		}
	}
	// The same request takes it over at once, told of the lost holder;
	// a release and a takeover again neither lose nor add to the count.
	tok := c.Token
	for round := 1; round <= 2; round++ {
		next := f.claim(t, id, "fp", longLease, longTTL)
		if next.Status != engine.Acquired || next.Abandoned != 1 {
			t.Fatalf("Claim %d after Release = %v, Abandoned %d; want acquired, 1", round, next.Status, next.Abandoned)
		}
		if next.Token <= tok {
			t.Errorf("Claim %d after Release token = %d, want > %d", round, next.Token, tok)
		}
		tok = next.Token
		if round == 1 {
			if err := f.store.Release(f.ctx, id, tok); err != nil {
				t.Fatalf("second Release error = %v", err)
			}
		}
	}
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete after the takeovers error = %v", err)
	}
	if in, ok := f.store.(engine.Inspector); ok {
		if r := f.lookup(t, in, id); !r.Completed || r.Abandoned != 1 {
			t.Errorf("Lookup after Complete = completed %v, Abandoned %d; want true, 1", r.Completed, r.Abandoned)
		}
	}
}

// outlive is the lease and TTL of the subtests that check that a record
// outlives its lease: long enough that the takeover, polled for, comes
// well within the TTL after the lease, however loaded the machine.
const outlive = time.Second

func testRecordOutlivesLease(t *testing.T, f fixture) {
	// A TTL no longer than the lease, as the options make for a TTL under
	// the default lease: the record must still be there when the lease
	// ends, so that the takeover is told of the lost holder.
	id := f.id("outlives-lease")
	f.acquire(t, id, "fp", outlive, outlive)
	if c := f.awaitAcquired(t, id, "fp", longLease, longTTL); c.Abandoned != 1 {
		t.Errorf("takeover of a record whose TTL equals its lease Abandoned = %d, want 1", c.Abandoned)
	}

	// The same when an Extend moved the lease's end past the claim's TTL.
	id = f.id("outlives-extended-lease")
	tok := f.acquire(t, id, "fp", outlive, outlive)
	if err := f.store.Extend(f.ctx, id, tok, outlive); err != nil {
		t.Fatalf("Extend error = %v", err)
	}
	if c := f.awaitAcquired(t, id, "fp", longLease, longTTL); c.Abandoned != 1 {
		t.Errorf("takeover of an extended lease Abandoned = %d, want 1", c.Abandoned)
	}

	// By the store's own account: the record expires a TTL after the
	// lease ends, after the Claim and after each Extend.
	in, ok := f.store.(engine.Inspector)
	if !ok {
		return
	}
	id = f.id("outlives-lookup")
	tok = f.acquire(t, id, "fp", longLease, shortTTL)
	check := func(when string) {
		t.Helper()
		r := f.lookup(t, in, id)
		if d := r.Expires.Sub(r.LeaseEnds); d < shortTTL-time.Millisecond {
			t.Errorf("after %s, the record expires %v after its lease ends, want at least the TTL, %v", when, d, shortTTL)
		}
	}
	check("the Claim")
	for _, lease := range []time.Duration{2 * longLease, longLease / 2} {
		if err := f.store.Extend(f.ctx, id, tok, lease); err != nil {
			t.Fatalf("Extend error = %v", err)
		}
		check("an Extend of " + lease.String())
	}
}

func testExtendKeepsAbandoned(t *testing.T, f fixture) {
	id := f.id("abandoned-extend")
	f.acquire(t, id, "fp", shortLease, longTTL)
	c := f.awaitAcquired(t, id, "fp", shortLease, longTTL)
	if c.Abandoned != 1 {
		t.Fatalf("takeover Abandoned = %d, want 1", c.Abandoned)
	}
	if err := f.store.Extend(f.ctx, id, c.Token, shortLease); err != nil {
		t.Fatalf("Extend error = %v", err)
	}
	next := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if next.Abandoned != 2 {
		t.Fatalf("takeover after an Extend Abandoned = %d, want 2", next.Abandoned)
	}
	if err := f.store.Extend(f.ctx, id, c.Token, longLease); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Extend by the holder taken over error = %v, want ErrLeaseLost", err)
	}
}
