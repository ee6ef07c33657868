package redisstore

import (
	"sync"

	"github.com/idemkit/idempotency/engine"
)

// maxFingerprints bounds the leases whose fingerprint a Store remembers: a
// lease whose holder never completes nor releases it is not remembered for
// ever, and a Store holding more leases at once than this only loses speed.
const maxFingerprints = 1 << 14

// fingerprints remembers the fingerprint (and the other facts of the
// in-flight record that Complete repeats) of each lease that a Store granted
// and that it has neither completed nor released, so that Complete can send
// the completed record whole and the function store it as it is. Without it,
// the function splices the fingerprint, which only the in-flight record
// holds, between the header and the response: one more copy of the response
// in Lua, where Redis hashes every byte of every string.
//
// It is a hint. The function compares the fingerprint sent with the record's
// and splices when they differ, so a lease granted by another Store, one
// forgotten, or one whose Complete is a retry, costs the splice and nothing
// else.
type fingerprints struct {
	mu sync.Mutex
	m  map[leaseKey]leaseFacts
}

// leaseFacts is what the completed record repeats of the in-flight one: the
// fingerprint, and what the claim answered of the record's abandoned
// holders and first claim.
type leaseFacts struct {
	fingerprint string
	abandoned   uint32
	created     int64
}

// leaseKey names a lease: the record's key and the lease's token.
type leaseKey struct {
	key   string
	token engine.Token
}

func newFingerprints() *fingerprints {
	return &fingerprints{m: make(map[leaseKey]leaseFacts)}
}

// put remembers the facts of the lease. When the map is full, it forgets every
// lease first: the leases of holders that never came back go too.
func (f *fingerprints) put(l leaseKey, facts leaseFacts) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.m) >= maxFingerprints {
		clear(f.m)
	}
	f.m[l] = facts
}

// take returns the facts of the lease, if remembered, and forgets them.
func (f *fingerprints) take(l leaseKey) (leaseFacts, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	facts, ok := f.m[l]
	if ok {
		delete(f.m, l)
	}
	return facts, ok
}
