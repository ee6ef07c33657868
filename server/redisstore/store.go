package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/server"
)

// DefaultPrefix is the key prefix of a Store made without WithPrefix.
const DefaultPrefix = "idempotency:"

// Store is a server.Store kept in Redis. Create one with New; it is safe for
// concurrent use, and any number of Stores, in any number of processes, share
// records when they share a Redis and a prefix. A Store starts no goroutines
// and owns nothing: the client is the caller's to close. The zero Store has
// no client: its methods fail.
type Store struct {
	client   redis.UniversalClient
	prefix   string
	claim    *redis.Script
	complete *redis.Script
	release  *redis.Script
	extend   *redis.Script
}

var _ server.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key the Store writes, DefaultPrefix by
// default, so that a Redis can hold other data, or the records of several
// APIs, side by side. Stores that share records must share the prefix. A
// prefix with a Cluster hash tag ("{idem}:") puts every record on one node.
func WithPrefix(prefix string) Option {
	return func(s *Store) { s.prefix = prefix }
}

// New returns a Store that keeps its records in the Redis that client talks
// to: a *redis.Client, a Sentinel-backed failover client or a
// *redis.ClusterClient. New does no I/O; each script is sent to each server
// once, on first use, and run by its SHA-1 digest afterwards.
//
// Give the client ContextTimeoutEnabled, so that a Redis that hangs fails the
// request when its context ends rather than after the client's own timeouts,
// and run Redis with maxmemory-policy noeviction (see the package
// documentation).
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	s := &Store{
		client:   client,
		prefix:   DefaultPrefix,
		claim:    redis.NewScript(claimLua),
		complete: redis.NewScript(completeLua),
		release:  redis.NewScript(releaseLua),
		extend:   redis.NewScript(extendLua),
	}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// RecordKey returns the Redis key that holds id's record, for an operator
// who needs to inspect or delete it (DEL removes the record: the key is new
// again). Every operation on id touches this key and no other.
func (s *Store) RecordKey(id server.ID) string { return recordKey(s.prefix, id) }

// Claim implements server.Store in one round trip. A completed record comes
// back whole and is decoded here; one that cannot be decoded fails the call
// with ErrCorruptRecord and is never replayed.
func (s *Store) Claim(ctx context.Context, id server.ID, fingerprint string, lease, ttl time.Duration) (server.Claim, error) {
	if err := s.usable(ctx); err != nil {
		return server.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	reply, err := s.run(ctx, s.claim, id,
		fingerprint, newNonce(), lease.Microseconds(), millis(max(ttl, lease)))
	if err != nil {
		return server.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	c, err := parseClaim(reply)
	if err != nil {
		return server.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	return c, nil
}

// parseClaim reads the claim script's answer.
func parseClaim(reply []any) (server.Claim, error) {
	switch code(reply) {
	case replyAcquired:
		if len(reply) == 2 {
			if s, ok := reply[1].(string); ok {
				if tok, err := strconv.ParseInt(s, 10, 64); err == nil {
					return server.Claim{Status: server.Acquired, Token: server.Token(tok)}, nil
				}
			}
		}
	case replyInFlight:
		if len(reply) == 3 {
			fp, ok1 := reply[1].(string)
			left, ok2 := reply[2].(int64)
			if ok1 && ok2 {
				return server.Claim{Status: server.InFlight, Fingerprint: fp, RetryAfter: time.Duration(left) * time.Microsecond}, nil
			}
		}
	case replyCompleted:
		if len(reply) == 2 {
			if rec, ok := reply[1].(string); ok {
				fp, resp, err := decodeCompleted(rec)
				if err != nil {
					return server.Claim{}, err
				}
				return server.Claim{Status: server.Completed, Fingerprint: fp, Response: resp}, nil
			}
		}
	case replyCorrupt:
		return server.Claim{}, corruptReply(reply)
	}
	return server.Claim{}, unexpected(reply)
}

// Complete implements server.Store in one round trip. The record, response
// included, then expires after ttl.
func (s *Store) Complete(ctx context.Context, id server.ID, token server.Token, resp *server.Response, ttl time.Duration) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	enc, err := encodeResponse(resp)
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	return s.update(ctx, "complete", s.complete, id, tokenArg(token), newNonce(), enc, millis(ttl))
}

// Release implements server.Store in one round trip. The record becomes a
// small tombstone that keeps the last token until the record would have
// expired, so that the next lease's token is larger.
func (s *Store) Release(ctx context.Context, id server.ID, token server.Token) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	return s.update(ctx, "release", s.release, id, tokenArg(token), newNonce())
}

// Extend implements server.Store in one round trip. The record's expiry is
// pushed back too if the new lease would outlive it.
func (s *Store) Extend(ctx context.Context, id server.ID, token server.Token, lease time.Duration) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	return s.update(ctx, "extend", s.extend, id, tokenArg(token), lease.Microseconds(), millis(lease))
}

// usable fails when the Store cannot make a call: it was not made by New, or
// ctx is done already.
func (s *Store) usable(ctx context.Context) error {
	if s.client == nil {
		return errors.New("Store not made by New")
	}
	return ctx.Err()
}

// update runs a script that answers done or lease lost.
func (s *Store) update(ctx context.Context, op string, script *redis.Script, id server.ID, args ...any) error {
	reply, err := s.run(ctx, script, id, args...)
	if err == nil {
		switch code(reply) {
		case replyDone:
			return nil
		case replyLeaseLost:
			err = server.ErrLeaseLost
		case replyCorrupt:
			err = corruptReply(reply)
		default:
			err = unexpected(reply)
		}
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}

// run runs script on id's record: EVALSHA, and EVAL when the server does not
// have the script yet, which loads it there.
func (s *Store) run(ctx context.Context, script *redis.Script, id server.ID, args ...any) ([]any, error) {
	reply, err := script.Run(ctx, s.client, []string{s.RecordKey(id)}, args...).Slice()
	if err != nil {
		// A deadline that passed while the client was busy is reported as
		// the context's, whatever the client made of it.
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			return nil, fmt.Errorf("%w: %w", cerr, err)
		}
		return nil, err
	}
	return reply, nil
}

// newNonce returns 8 random bytes that mark one call, so that a script sent
// again by the client after a lost reply recognises its own earlier effect.
// The generator need not be unpredictable, only unlikely to repeat.
func newNonce() []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, nonceLen), rand.Uint64())
}

// tokenArg formats a token as the scripts compare it.
func tokenArg(t server.Token) string { return strconv.FormatInt(int64(t), 10) }

// millis rounds d up to whole milliseconds, at least one: Redis deletes a key
// given an expiry of zero.
func millis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return max(1, ms)
}

func code(reply []any) int64 {
	if len(reply) == 0 {
		return -1
	}
	c, ok := reply[0].(int64)
	if !ok {
		return -1
	}
	return c
}

func corruptReply(reply []any) error {
	why, _ := reply[len(reply)-1].(string)
	return corrupt("%s", why)
}

func unexpected(reply []any) error {
	return fmt.Errorf("unexpected script reply of %d elements", len(reply))
}
