package redisstore

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Lookup implements engine.Inspector in one round trip, with the steps of
// a record in flight that holds steps. Created is the
// clock of the machine whose Store first claimed the record, at the claim;
// LeaseEnds and Expires are the Redis server's clock at the lookup plus
// what the record's expiry has left. A record written by an earlier release (version
// 1 or 2) has no Created; its Abandoned is 0.
func (s *store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	if err := s.usable(ctx); err != nil {
		return engine.Record{}, fmt.Errorf("redisstore: lookup: %w", err)
	}
	key := s.RecordKey(id)
	reply, err := s.call(ctx, s.lib.lookup, key, stepsKey(s.prefix, key))
	if err != nil {
		return engine.Record{}, fmt.Errorf("redisstore: lookup: %w", err)
	}
	r, err := parseLookup(id, reply)
	if err != nil {
		return engine.Record{}, fmt.Errorf("redisstore: lookup: %w", err)
	}
	return r, nil
}

// parseLookup reads the lookup function's answer.
func parseLookup(id engine.ID, reply any) (engine.Record, error) {
	switch r := reply.(type) {
	case int64:
		if r == replyNotFound {
			return engine.Record{}, engine.ErrNotFound
		}
	case []any:
		switch code(r) {
		case replyCorrupt:
			return engine.Record{}, corruptReply(r)
		case replyFound:
			if len(r) != 4 && len(r) != 5 {
				break
			}
			v, ok1 := r[1].(string)
			pttl, ok2 := r[2].(int64)
			now, ok3 := r[3].(int64)
			if !ok1 || !ok2 || !ok3 {
				break
			}
			rec, err := recordOf(id, v, pttl, time.UnixMilli(now))
			if err == nil && len(r) == 5 {
				rec.Steps, err = decodeSteps(r[4])
			}
			if err != nil {
				return engine.Record{}, err
			}
			return rec, nil
		}
	}
	return engine.Record{}, unexpected(reply)
}

// recordOf decodes v, a live record with pttl ms left, read at now.
func recordOf(id engine.ID, v string, pttl int64, now time.Time) (engine.Record, error) {
	rec, err := decodeRecord(v)
	if err != nil {
		return engine.Record{}, err
	}
	if rec.state == stateReleased {
		return engine.Record{}, engine.ErrNotFound
	}
	out := engine.Record{
		ID:          id,
		Completed:   rec.state == stateCompleted,
		Fingerprint: rec.fingerprint,
		Token:       rec.token,
		Abandoned:   int(rec.abandoned),
		Response:    rec.response,
	}
	if rec.state == stateSteps && rec.abandoned == math.MaxUint32 {
		// -1: released by the holder that created it (see Store.Release).
		out.Abandoned = 0
	}
	if rec.created != 0 {
		out.Created = time.UnixMilli(rec.created)
	}
	// PTTL is -1 for a key without expiry, which only an operator's write
	// makes: the record never expires.
	if pttl >= 0 {
		out.Expires = now.Add(fromMillis(pttl))
	}
	if !out.Completed {
		switch rec.version {
		case legacyVersion:
			out.LeaseEnds = time.UnixMicro(rec.leaseEnd)
		default:
			out.LeaseEnds = now.Add(fromMillis(pttl - rec.slack))
		}
	}
	return out, nil
}

// Resolve implements engine.Inspector in one round trip. The record keeps
// its token, so that a holder still running is refused (engine.ErrLeaseLost)
// from then on; with resp nil it becomes a released record, which Lookup
// does not find and the next Claim takes with a larger token. Either way
// its steps are deleted.
func (s *store) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: resolve: %w", err)
	}
	key := s.RecordKey(id)
	args := []any{stepsKey(s.prefix, key)}
	if resp == nil {
		args = append(args, tombstone(0))
	} else {
		rec, err := encodeRecord(record{
			version:  recordVersion,
			state:    stateCompleted,
			nonce:    rand.Uint64(),
			response: resp,
		})
		if err != nil {
			return fmt.Errorf("redisstore: resolve: %w", err)
		}
		args = append(args, rec, millis(ttl))
	}
	reply, err := s.call(ctx, s.lib.resolve, key, args...)
	if err == nil {
		switch r := reply.(type) {
		case int64:
			switch r {
			case replyDone:
				return nil
			case replyNotFound:
				return fmt.Errorf("redisstore: resolve: %w", engine.ErrNotFound)
			}
		case []any:
			if code(r) == replyCorrupt {
				return fmt.Errorf("redisstore: resolve: %w", corruptReply(r))
			}
		}
		err = unexpected(reply)
	}
	return fmt.Errorf("redisstore: resolve: %w", err)
}
