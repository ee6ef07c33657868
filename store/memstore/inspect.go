package memstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Lookup implements engine.Inspector. Its times are wall-clock times: the
// wall clock's reading when the store was made, plus the store's monotonic
// clock since then, so a change of the system's clock after New does not
// move them. A lease or a life that never ends (math.MaxInt64) ends about
// 292 years after New.
func (s *store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	sh, err := s.lock(ctx, "lookup", id)
	if err != nil {
		return engine.Record{}, err
	}
	defer sh.mu.Unlock()
	r, ok := sh.m[id]
	if !ok || s.now() >= r.expiresAt {
		return engine.Record{}, fmt.Errorf("memstore: lookup: %w", engine.ErrNotFound)
	}
	rec := engine.Record{
		ID:          id,
		Completed:   r.resp != nil,
		Fingerprint: r.fingerprint,
		Token:       r.token,
		Abandoned:   int(max(r.abandoned, 0)),
		Created:     s.wall(r.created),
		Expires:     s.wall(r.expiresAt),
		Response:    r.resp,
		Steps:       slices.Clone(r.steps),
	}
	if r.resp == nil {
		rec.LeaseEnds = s.wall(r.leaseUntil)
	}
	return rec, nil
}

// Resolve implements engine.Inspector. A response stored by Resolve counts
// toward the byte bound as one stored by Complete does, and at the bound it
// is kept without its body in the same way. The ttl is saturated, as in
// Claim.
func (s *store) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	sh, err := s.lock(ctx, "resolve", id)
	if err != nil {
		return err
	}
	defer sh.mu.Unlock()
	now := s.now()
	r, ok := sh.m[id]
	if !ok || now >= r.expiresAt {
		return fmt.Errorf("memstore: resolve: %w", engine.ErrNotFound)
	}
	if resp == nil {
		s.remove(sh, id, r)
		return nil
	}
	// A completed record refuses every token, so the holder, if one is
	// still running, is fenced off from here on. Its steps go.
	s.dropSteps(&r)
	if r.resp != nil {
		old := int64(r.resp.Size())
		s.bytes.Add(-old)
		r.size -= old
	}
	resp, size := s.fit(resp)
	r.resp = resp
	r.size += size
	r.leaseUntil = now
	r.expiresAt = now.add(ttl)
	sh.m[id] = r
	return nil
}
