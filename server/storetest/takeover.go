package storetest

import (
	"errors"
	"testing"

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

func testReleaseForgetsAbandoned(t *testing.T, f fixture) {
	id := f.id("abandoned-release")
	f.acquire(t, id, "fp", shortLease, longTTL)
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if c.Abandoned != 1 {
		t.Fatalf("takeover Abandoned = %d, want 1", c.Abandoned)
	}
	if err := f.store.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	// The release deleted the record, and its count with it.
	next := f.claim(t, id, "fp", longLease, longTTL)
	if next.Status != engine.Acquired || next.Abandoned != 0 {
		t.Fatalf("Claim after Release = %v, Abandoned %d; want acquired, 0", next.Status, next.Abandoned)
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
