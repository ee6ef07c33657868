package pgstore

import (
	"testing"

	"github.com/idemkit/idempotency/engine"
)

// recentKeys remembers a key until another of the same slot takes it, and
// tells scopes apart.
func TestRecentKeys(t *testing.T) {
	r := newRecentKeys()
	a := r.hash(engine.ID{Scope: "tenant-a", Key: "order-1"})
	if a == 0 || r.has(a) {
		t.Fatalf("hash %x: remembered before it was added", a)
	}
	r.add(a)
	if !r.has(a) {
		t.Fatal("an added key is not remembered")
	}
	if b := r.hash(engine.ID{Scope: "tenant-b", Key: "order-1"}); b == a || r.has(b) {
		t.Fatalf("another scope's key: hash %x, remembered %v", b, r.has(b))
	}
	// A key whose hash falls in the same slot takes it.
	same := a ^ 1<<2
	if r.slot(same) != r.slot(a) {
		t.Fatal("hashes that differ in low bits only should share a slot")
	}
	r.add(same)
	if r.has(a) || !r.has(same) {
		t.Fatalf("after a key of the same slot: first remembered %v, second %v", r.has(a), r.has(same))
	}
	if r.hash(engine.ID{}) == 0 {
		t.Fatal("the empty ID hashes to 0, the empty slot")
	}
}
