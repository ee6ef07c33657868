package pgstore

import (
	"hash/maphash"
	"sync/atomic"

	"github.com/idemkit/idempotency/engine"
)

// recentSlots is how many keys recentKeys remembers at most: 64 KiB of
// hashes. A Store that claims a thousand new keys a second keeps a key for
// eight seconds on average, the time in which a client's retries come.
const (
	recentBits  = 13
	recentSlots = 1 << recentBits
)

// recentKeys remembers the keys of this Store's last claims, by a hash of
// each, in a table of slots that a later key overwrites. A claim of a key
// that it remembers is most likely a retry of a request that this Store
// claimed, or answered, moments ago: so the claim reads the key first,
// whatever the claims of other keys weigh (see readFirst), and it does not
// weigh in them, so that a run of retries answered here does not make the
// next new keys pay for a SELECT. It is a guess, never an answer: a key
// that it remembers wrongly (its record gone, or another key of the same
// hash) costs its claim a SELECT that finds nothing, then the INSERT.
type recentKeys struct {
	seed  maphash.Seed
	slots [recentSlots]atomic.Uint64
}

func newRecentKeys() *recentKeys { return &recentKeys{seed: maphash.MakeSeed()} }

// hash is id's hash, never 0, which marks an empty slot.
func (r *recentKeys) hash(id engine.ID) uint64 {
	h := maphash.String(r.seed, id.Scope)*0x9e3779b97f4a7c15 ^ maphash.String(r.seed, id.Key)
	return h | 1
}

// slot is h's slot, picked by its high bits (its lowest one is always set).
func (r *recentKeys) slot(h uint64) *atomic.Uint64 {
	return &r.slots[h>>(64-recentBits)]
}

// has reports whether the key of hash h is remembered.
func (r *recentKeys) has(h uint64) bool { return r.slot(h).Load() == h }

// add remembers the key of hash h.
func (r *recentKeys) add(h uint64) {
	if s := r.slot(h); s.Load() != h {
		s.Store(h)
	}
}
