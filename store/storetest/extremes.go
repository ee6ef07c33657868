package storetest

import (
	"math"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// The subtests in this file give leases and TTLs at the ends of their range:
// a store must neither overflow its time arithmetic on the largest (a deadline
// in the past forgets a record, or lets a duplicate run) nor mistake the
// smallest for none.

const forever = time.Duration(math.MaxInt64)

// farFuture is a time that a deadline saturated at the largest duration is
// past.
func farFuture() time.Time { return time.Now().AddDate(100, 0, 0) }

func testMaxTTL(t *testing.T, f fixture) {
	id := f.id("max-ttl")
	tok := f.acquire(t, id, "fp", longLease, forever)
	if c := f.claim(t, id, "fp", longLease, forever); c.Status != engine.InFlight {
		t.Fatalf("Claim of a record with the largest TTL status = %v, want in flight", c.Status)
	}
	want := sampleResponse()
	if err := f.store.Complete(f.ctx, id, tok, want, forever); err != nil {
		t.Fatalf("Complete with the largest TTL error = %v", err)
	}
	for range 2 {
		c := f.claim(t, id, "fp", longLease, forever)
		if c.Status != engine.Completed {
			t.Fatalf("Claim after Complete with the largest TTL status = %v, want completed", c.Status)
		}
		assertResponse(t, c.Response, want)
	}
	if in, ok := f.store.(engine.Inspector); ok {
		r, err := in.Lookup(f.ctx, id)
		if err != nil {
			t.Fatalf("Lookup error = %v", err)
		}
		if !r.Expires.After(farFuture()) {
			t.Errorf("Lookup of a record with the largest TTL Expires = %v, want after %v", r.Expires, farFuture())
		}
		if err := in.Resolve(f.ctx, id, resolvedResponse(), forever); err != nil {
			t.Fatalf("Resolve with the largest TTL error = %v", err)
		}
		assertResponse(t, f.claim(t, id, "fp", longLease, longTTL).Response, resolvedResponse())
	}
}

func testMaxLease(t *testing.T, f fixture) {
	id := f.id("max-lease")
	tok := f.acquire(t, id, "fp", forever, longTTL)
	c := f.claim(t, id, "fp", forever, longTTL)
	if c.Status != engine.InFlight {
		t.Fatalf("concurrent Claim of a lease of the largest length status = %v, want in flight", c.Status)
	}
	if c.RetryAfter <= longTTL {
		t.Errorf("concurrent Claim RetryAfter = %v, want more than %v", c.RetryAfter, longTTL)
	}
	if err := f.store.Extend(f.ctx, id, tok, forever); err != nil {
		t.Fatalf("Extend by the largest lease error = %v", err)
	}
	if c := f.claim(t, id, "fp", forever, forever); c.Status != engine.InFlight {
		t.Fatalf("Claim after Extend by the largest lease status = %v, want in flight", c.Status)
	}
	if in, ok := f.store.(engine.Inspector); ok {
		r, err := in.Lookup(f.ctx, id)
		if err != nil {
			t.Fatalf("Lookup error = %v", err)
		}
		if !r.LeaseEnds.After(farFuture()) || r.Expires.Before(r.LeaseEnds) {
			t.Errorf("Lookup of a lease of the largest length LeaseEnds = %v, Expires = %v; want after %v, and no earlier", r.LeaseEnds, r.Expires, farFuture())
		}
	}
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete of a lease of the largest length error = %v", err)
	}
	if c := f.claim(t, id, "fp", forever, forever); c.Status != engine.Completed {
		t.Fatalf("Claim after Complete status = %v, want completed", c.Status)
	}
}

func testTinyDurations(t *testing.T, f fixture) {
	// A lease of 1ns has ended by the next Claim: that one takes over.
	id := f.id("tiny-lease")
	tok := f.acquire(t, id, "fp", time.Nanosecond, longTTL)
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if c.Token <= tok || c.Abandoned != 1 {
		t.Errorf("takeover of a 1ns lease = token %d, Abandoned %d; want > %d, 1", c.Token, c.Abandoned, tok)
	}

	// So has a lease extended by 1ns.
	id = f.id("tiny-extend")
	tok = f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Extend(f.ctx, id, tok, time.Nanosecond); err != nil {
		t.Fatalf("Extend by 1ns error = %v", err)
	}
	if c := f.awaitAcquired(t, id, "fp", longLease, longTTL); c.Abandoned != 1 {
		t.Errorf("takeover of a lease extended by 1ns Abandoned = %d, want 1", c.Abandoned)
	}

	// A record completed with a TTL of 1ns is forgotten: the key is new
	// again, for any request.
	id = f.id("tiny-ttl")
	tok = f.acquire(t, id, "fp", longLease, longTTL)
	if err := f.store.Complete(f.ctx, id, tok, sampleResponse(), time.Nanosecond); err != nil {
		t.Fatalf("Complete with a TTL of 1ns error = %v", err)
	}
	if c := f.awaitAcquired(t, id, "fp-new", longLease, longTTL); c.Abandoned != 0 {
		t.Errorf("Claim after a TTL of 1ns Abandoned = %d, want 0", c.Abandoned)
	}

	// Both at once: a record that lives no longer than its lease.
	id = f.id("tiny-both")
	f.acquire(t, id, "fp", time.Nanosecond, time.Nanosecond)
	f.awaitAcquired(t, id, "fp-new", longLease, longTTL)
}
