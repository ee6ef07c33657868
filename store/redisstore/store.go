package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/steps"
)

// defaultPrefix is the key prefix of a Store made without [WithPrefix].
const defaultPrefix = "idempotency:"

// Store is an engine.Store kept in Redis, which keeps steps
// (engine.StepStore) and lets an operator inspect its records
// (engine.Inspector). Create one with New (or Open); it is safe for
// concurrent use, and any number of Stores, in any number of processes, share
// records when they share a Redis and a prefix. A Store owns nothing: the
// client is the caller's to close. It starts no goroutine: each call runs
// on its caller's, bounded by its context whatever the client's options
// (see New). It keeps,
// in memory, the fingerprint of each lease it granted until it completes or
// releases it, a few thousand at most (see the package documentation,
// Functions).
type Store interface {
	engine.StepStore
	engine.Inspector
	// RecordKey returns the Redis key that holds id's record, for an operator
	// who needs to inspect or delete it (DEL removes the record: the key is new
	// again). Every operation on id touches this key, and, only for a record
	// that holds steps, the key of its steps, in the same Cluster slot (see
	// Steps in the package documentation), which a DEL of the record may leave
	// until it expires: the next record of the key does not see those steps.
	RecordKey(id engine.ID) string
	// Check reads the memory limit and eviction policy of every Redis master
	// the Store writes to (each master of a Cluster, each shard of a Ring), with
	// CONFIG GET, or, where the server refuses it (a managed Redis, or a user
	// without +config|get), INFO memory. It returns an error wrapping
	// ErrEviction when one of them may evict records, another error when it
	// cannot tell, and nil otherwise: a health check to run at start (Open does)
	// and now and then, since a policy can be changed while the Store runs.
	Check(ctx context.Context) error
}

// store is the Store that New makes.
type store struct {
	client redis.UniversalClient
	prefix string
	lib    library
	fps    *fingerprints
	logger *slog.Logger
	strict bool
	// deaf is set for a Cluster or Ring client without
	// ContextTimeoutEnabled, which bounds its I/O by its own timeouts and
	// not by the call's context: the Store then calls the node that owns a
	// record's key through a clone of the node's client that has it
	// (hearing.go).
	deaf bool
	// nodes holds those clones, by the node's client: a *redis.Client to
	// a *redis.Client.
	nodes sync.Map
	// nnodes counts the clones in nodes.
	nnodes atomic.Int64
	// mapped is set once a call through a Cluster client was answered:
	// the client then has a slot map, and tells a key's master without
	// I/O.
	mapped atomic.Bool
	// ack is what WithReplicaAck asks for; replicas 0 asks for nothing.
	ack replicaAck
	// bulkLimit is the server's proto-max-bulk-len once read, 0 before.
	bulkLimit atomic.Int64
	// called is set once a function call succeeded: until then, a claim
	// calls the claim function, so that a Redis where the functions cannot
	// run (no FCALL, or the ACL refuses them or their loading) refuses the
	// first claim rather than the completion that follows it.
	called atomic.Bool
}

var _ Store = (*store)(nil)

// New returns a Store that keeps its records in the Redis that client talks
// to: a *redis.Client, a Sentinel-backed failover client, a
// *redis.ClusterClient or a *redis.Ring (each record, and its steps, on
// the shard of the record's key). New does no I/O: the Store loads its function library
// into a server (FUNCTION LOAD) the first time it finds the server without
// it, and calls the functions (FCALL) afterwards.
//
// Give the client ContextTimeoutEnabled, so that go-redis ends its I/O at a
// call's deadline, and run Redis with maxmemory-policy noeviction: Open
// checks it. A client without ContextTimeoutEnabled is used through clones
// that have it: a *redis.Client through one (Client.WithTimeout) that
// shares its connection pool, a Cluster or Ring client through one of each
// node's client, the master or shard that owns the key, made the first time
// a call goes to it; their I/O ends at the earlier of the client's own
// timeouts and the call's deadline, and they run none of the client's
// hooks. An invalid option is named in New's error.
func New(client redis.UniversalClient, opts ...Option) (Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	client, deaf := hearing(client)
	return &store{
		client: client, prefix: c.prefix, logger: c.logger, strict: c.strict, ack: c.ack,
		lib: newLibrary(), fps: newFingerprints(), deaf: deaf,
	}, nil
}

// RecordKey implements Store.
func (s *store) RecordKey(id engine.ID) string { return recordKey(s.prefix, id) }

// Claim implements engine.Store. A claim that finds no record, or a
// completed one, is one command, SET NX PX GET, which writes nothing when
// the key has a record: a first execution's claim and a replay are one round
// trip, and a replay writes nothing. A claim that finds a record in flight
// or released takes a second round trip, the claim function, which judges
// its lease by the record's expiry (see the package documentation, Leases).
// Until a function call of the Store has succeeded, its claims call the
// claim function, which does the same in one round trip, so that a Redis
// that cannot run the functions refuses the first claim, not its
// completion. A completed record comes back whole and is decoded here; one that cannot
// be decoded fails the call with ErrCorruptRecord and is never replayed. A
// claim that takes over or re-acquires a record that holds steps returns
// them (Claim.Steps), from the claim function's answer; a new record's
// claim never reads a steps key.
//
// The token of a new lease is proposed here, from this machine's clock in
// microseconds, and written with the record, with the time of the claim;
// the key takes it when it has no record, and the function max(the record's
// token + 1, the proposal) when the record is released or its lease
// expired.
func (s *store) Claim(ctx context.Context, id engine.ID, fingerprint string, lease, ttl time.Duration) (engine.Claim, error) {
	if err := s.usable(ctx); err != nil {
		return engine.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	// The record outlives the lease by the TTL (its slack): a holder lost
	// at its lease's end may have done its work then, and the retry must
	// see it.
	px := millis(addDur(lease, ttl))
	now := time.Now()
	proposed := engine.Token(max(1, now.UnixMicro()))
	rec, err := encodeRecord(record{
		version:     recordVersion,
		state:       stateInFlight,
		token:       proposed,
		nonce:       rand.Uint64(),
		slack:       px - millis(lease),
		created:     now.UnixMilli(),
		fingerprint: fingerprint,
	})
	if err != nil {
		return engine.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	key := s.RecordKey(id)
	var (
		c       engine.Claim
		created int64
	)
	if s.ack.replicas > 0 {
		var reply any
		if reply, err = s.claimAcked(ctx, id, key, rec, px, stepsKey(s.prefix, key)); err == nil {
			c, created, err = parseClaim(reply)
		}
	} else if !s.called.Load() {
		var reply any
		if reply, err = s.call(ctx, s.lib.claim, key, rec, px, stepsKey(s.prefix, key)); err == nil {
			c, created, err = parseClaim(reply)
		}
	} else {
		c, created, err = s.claim(ctx, key, rec, px)
	}
	if err != nil {
		return engine.Claim{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	if c.Status == engine.Acquired {
		s.fps.put(leaseKey{key, c.Token}, leaseFacts{fingerprint, uint32(c.Abandoned), created})
	}
	return c, nil
}

// claim writes rec, an in-flight record, at key if the key has no record,
// with SET NX PX GET, which returns the record that the key has instead
// and then writes nothing. A completed record is the answer; one in any
// other state is left to the claim function, which may take it over.
func (s *store) claim(ctx context.Context, key string, rec []byte, px int64) (engine.Claim, int64, error) {
	v, err := onNode(ctx, s, key, func(c redis.UniversalClient) (any, error) {
		return c.Do(ctx, "set", key, rec, "nx", "px", px, "get").Result()
	})
	switch {
	case errors.Is(err, redis.Nil):
		return engine.Claim{Status: engine.Acquired, Token: engine.Token(binary.BigEndian.Uint64(rec[2:10]))},
			int64(binary.BigEndian.Uint64(rec[34:42])), nil
	case err != nil:
		if redis.HasErrorPrefix(err, "WRONGTYPE") {
			return engine.Claim{}, 0, corrupt("%s", err.Error())
		}
		s.reloadSlots(err)
		return engine.Claim{}, 0, contextual(ctx, explained(err))
	}
	if r, ok := v.(string); ok && len(r) >= 2 && r[1] == stateCompleted {
		c, err := parseClaimReply(r)
		return c, 0, err
	}
	reply, err := s.call(ctx, s.lib.claim, key, rec, px, stepsKey(s.prefix, key))
	if err != nil {
		return engine.Claim{}, 0, err
	}
	return parseClaim(reply)
}

// parseClaim reads the claim function's answer, and, for a lease, when the
// record was first claimed (ms since the epoch).
func parseClaim(reply any) (engine.Claim, int64, error) {
	c, err := parseClaimReply(reply)
	if err != nil || c.Status != engine.Acquired {
		return c, 0, err
	}
	r := reply.([]any)
	return c, r[3].(int64), nil
}

func parseClaimReply(reply any) (engine.Claim, error) {
	switch r := reply.(type) {
	case string:
		rec, err := decodeRecord(r)
		if err != nil {
			return engine.Claim{}, err
		}
		if rec.state != stateCompleted {
			return engine.Claim{}, corrupt("record in state %d, want completed", rec.state)
		}
		return engine.Claim{Status: engine.Completed, Fingerprint: rec.fingerprint, Response: rec.response}, nil
	case []any:
		switch code(r) {
		case replyAcquired:
			if len(r) == 4 || len(r) == 5 {
				tok, ok1 := r[1].(int64)
				ab, ok2 := r[2].(int64)
				_, ok3 := r[3].(int64)
				if ok1 && ok2 && ok3 && ab >= 0 && ab <= math.MaxUint32 {
					c := engine.Claim{Status: engine.Acquired, Token: engine.Token(tok), Abandoned: int(ab)}
					if len(r) == 5 {
						steps, err := decodeSteps(r[4])
						if err != nil {
							return engine.Claim{}, err
						}
						c.Steps = steps
					}
					return c, nil
				}
			}
		case replyInFlight:
			if len(r) == 3 {
				fp, ok1 := r[1].(string)
				left, ok2 := r[2].(int64)
				if ok1 && ok2 {
					return engine.Claim{Status: engine.InFlight, Fingerprint: fp, RetryAfter: fromMillis(left)}, nil
				}
			}
		case replyCorrupt:
			return engine.Claim{}, corruptReply(r)
		}
	}
	return engine.Claim{}, unexpected(reply)
}

// Complete implements engine.Store in one round trip. The record, response
// included, then expires after ttl; its steps, if any, are deleted.
//
// A response that Redis will never accept fails with an error wrapping
// engine.ErrNotStorable, and the record stays in flight with its lease: a
// record larger than a Redis string (512 MiB), one that Redis refuses as an
// argument larger than its proto-max-bulk-len ("Protocol error: invalid bulk
// length", or the connection reset while the record was sent, when the
// record is larger than the limit that CONFIG GET reads), or a string larger
// than Redis keeps ("string exceeds maximum allowed size"). Every other
// error, a full Redis (OOM) included, may pass.
func (s *store) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if resp == nil {
		return errors.New("redisstore: complete: nil response")
	}
	key := s.RecordKey(id)
	facts, _ := s.fps.take(leaseKey{key, token})
	rec, err := encodeRecord(record{
		version:     recordVersion,
		state:       stateCompleted,
		token:       token,
		nonce:       rand.Uint64(),
		fingerprint: facts.fingerprint,
		abandoned:   facts.abandoned,
		created:     facts.created,
		response:    resp,
	})
	if err == nil && len(rec) > maxValue {
		err = fmt.Errorf("a record of %d bytes, larger than Redis keeps: %w", len(rec), engine.ErrNotStorable)
	}
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	if limit := s.bulkLimit.Load(); limit > 0 && int64(len(rec)) > limit {
		return fmt.Errorf("redisstore: complete: a record of %d bytes, above the server's proto-max-bulk-len %d: %w", len(rec), limit, engine.ErrNotStorable)
	}
	err = s.update(ctx, "complete", s.lib.complete, key, heldBy(token), rec, millis(ttl), stepsKey(s.prefix, key))
	if err != nil && (notStorable(err) || s.aboveBulkLimit(ctx, key, len(rec), err)) {
		return fmt.Errorf("%w (%w)", err, engine.ErrNotStorable)
	}
	return err
}

// minBulkLimit is the smallest proto-max-bulk-len that Redis accepts.
const minBulkLimit = 1 << 20

// aboveBulkLimit reports whether a record of n bytes, whose call failed
// with err, is larger than the server's proto-max-bulk-len. Redis answers
// such an argument with a protocol error and closes the connection, often
// while the client still writes it: the client then sees the connection
// reset, not the answer. So after a failure with no answer from Redis, a
// record that large has the limit read (CONFIG GET, once per Store) and
// compared; where the limit cannot be read, the failure stays one that
// another try may mend.
func (s *store) aboveBulkLimit(ctx context.Context, key string, n int, err error) bool {
	var reply redis.Error
	if n <= minBulkLimit || errors.As(err, &reply) || ctx.Err() != nil {
		return false
	}
	limit := s.bulkLimit.Load()
	if limit == 0 {
		// On a Cluster or Ring client without ContextTimeoutEnabled, the
		// master's client does not bound its I/O by ctx.
		read, err := bounded(ctx, s.deaf, func() (int64, error) { return s.readBulkLimit(ctx, key) })
		if err != nil {
			return false
		}
		limit = read
		s.bulkLimit.Store(limit)
	}
	return int64(n) > limit
}

// readBulkLimit reads proto-max-bulk-len on the server that a call on key
// goes to.
func (s *store) readBulkLimit(ctx context.Context, key string) (int64, error) {
	var node redis.Cmdable = s.client
	if c, ok := s.client.(*redis.ClusterClient); ok {
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return 0, err
		}
		node = m
	}
	cfg, err := node.ConfigGet(ctx, "proto-max-bulk-len").Result()
	if err != nil {
		return 0, err
	}
	limit, err := strconv.ParseInt(cfg["proto-max-bulk-len"], 10, 64)
	if err == nil && limit <= 0 {
		err = fmt.Errorf("proto-max-bulk-len %d", limit)
	}
	return limit, err
}

// maxValue is the largest string Redis keeps: 512 MiB.
const maxValue = 512 << 20

// notStorable reports whether err is Redis's refusal of a value that it
// refuses whatever the time: an argument larger than its proto-max-bulk-len
// (a protocol error, after which it closes the connection), or a string
// larger than it keeps. A full Redis (OOM) is not one of them: memory comes
// back.
func notStorable(err error) bool {
	return redis.HasErrorPrefix(err, "Protocol error: invalid bulk length") ||
		redis.HasErrorPrefix(err, "string exceeds maximum allowed size")
}

// Release implements engine.Store in one round trip. A record that the
// holder's Claim created becomes a small tombstone that keeps the last token
// until the record would have expired, so that the next lease's token is
// larger. One that the Claim took over from lost holders, or one that holds
// steps, goes back to how the Claim found it, with the next token: in
// flight, its lease ended, one holder fewer counted (for the holder that
// created it, -1), which the next takeover counts again; its steps stay,
// with its expiry.
func (s *store) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	key := s.RecordKey(id)
	s.fps.take(leaseKey{key, token})
	return s.update(ctx, "release", s.lib.release, key, heldBy(token), tombstone(token), stepsKey(s.prefix, key))
}

// Extend implements engine.Store in one round trip. The record's expiry
// moves with the lease's end, keeping the TTL that the Claim put between
// them (the record's slack), and its steps' expiry with it.
func (s *store) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	key := s.RecordKey(id)
	return s.update(ctx, "extend", s.lib.extend, key, heldBy(token), millis(lease), stepsKey(s.prefix, key))
}

// tombstone returns a released record that keeps token, with a nonce of
// its own.
func tombstone(token engine.Token) []byte {
	b := appendHead(make([]byte, 0, recordHeader), recordVersion, stateReleased, token, rand.Uint64(), 0)
	return append(b, make([]byte, recordHeader-len(b))...)
}

// heldBy returns the first ten bytes of a record in flight with token:
// version, state and token, which the functions compare with the record's.
func heldBy(token engine.Token) []byte {
	return binary.BigEndian.AppendUint64(append(make([]byte, 0, 10), recordVersion, stateInFlight), uint64(token))
}

// usable fails when the Store cannot make a call: it was not made by New, or
// ctx is done already.
func (s *store) usable(ctx context.Context) error {
	if s.client == nil {
		return errors.New("Store not made by New")
	}
	return ctx.Err()
}

// update calls a function that answers done or lease lost. A completion
// or a step WithReplicaAck waits for the replicas too.
func (s *store) update(ctx context.Context, op, fn, key string, args ...any) error {
	if (op != "complete" && op != "save step") || s.ack.replicas == 0 {
		reply, err := s.call(ctx, fn, key, args...)
		if err == nil {
			err = updated(reply)
		}
		if err != nil {
			return fmt.Errorf("redisstore: %s: %w", op, err)
		}
		return nil
	}
	reply, acked, err := s.callAcked(ctx, fn, key, args...)
	if reply != nil {
		if uerr := updated(reply); uerr != nil {
			return fmt.Errorf("redisstore: %s: %w", op, uerr)
		}
		if err == nil && acked < int64(s.ack.replicas) {
			err = fmt.Errorf("%d of %d replicas in %v: %w", acked, s.ack.replicas, s.ack.timeout, ErrNotReplicated)
		} else if err != nil {
			err = fmt.Errorf("%w: %w", ErrNotReplicated, err)
		}
	}
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	return nil
}

// updated reads the answer of a function that answers done or lease lost.
func updated(reply any) error {
	switch r := reply.(type) {
	case int64:
		switch r {
		case replyDone:
			return nil
		case replyLeaseLost:
			return engine.ErrLeaseLost
		case replyTooMany:
			return fmt.Errorf("more than %d steps: %w", steps.MaxSteps, engine.ErrNotStorable)
		}
	case []any:
		if code(r) == replyCorrupt {
			return corruptReply(r)
		}
	}
	return unexpected(reply)
}

// loadAttempts bounds how many times a call loads the library and tries
// again: a Cluster that moves the key's slot meanwhile may send the call to
// another node that lacks it.
const loadAttempts = 3

// call calls fn on the record at key: FCALL, and, when the server answers that it
// has no such function (it restarted without persistence, its functions were
// flushed, or it is a replica promoted without them), FUNCTION LOAD on the
// node that owns the key and FCALL again. A function not found has not run,
// so calling it again is safe.
func (s *store) call(ctx context.Context, fn, key string, args ...any) (any, error) {
	for attempt := 0; ; attempt++ {
		reply, err := s.fcall(ctx, fn, key, args...)
		if err == nil {
			if !s.called.Load() {
				s.called.Store(true)
			}
			return reply, nil
		}
		if attempt < loadAttempts && functionMissing(err) {
			// On a Cluster or Ring client without ContextTimeoutEnabled,
			// the load talks to the nodes through the client's own node
			// clients, by their own timeouts.
			_, err := bounded(ctx, s.deaf, func() (struct{}, error) { return struct{}{}, s.load(ctx, key) })
			if err != nil {
				return nil, contextual(ctx, fmt.Errorf("loading the function library: %w", explained(err)))
			}
			continue
		}
		s.reloadSlots(err)
		return nil, contextual(ctx, explained(err))
	}
}

// permissionRefused reports whether err is Redis's refusal of a command by
// the user's ACL: NOPERM, or, from a function on Redis 7.0, an error of its
// own words.
func permissionRefused(err error) bool {
	return redis.HasErrorPrefix(err, "NOPERM") ||
		redis.HasErrorPrefix(err, "The user executing the script can't run this command")
}

// explained adds to an error of Redis's that the operator must act on
// what to do about it.
func explained(err error) error {
	switch {
	case permissionRefused(err):
		return fmt.Errorf("the Redis user may not run a command the Store needs (the package documentation, ACL, lists them): %w", err)
	case redis.HasErrorPrefix(err, "unknown command") || redis.HasErrorPrefix(err, "ERR unknown command"):
		return fmt.Errorf("the Store needs Redis 7.0 or later, with Functions (FCALL): %w", err)
	}
	return err
}

// fcall calls fn once.
func (s *store) fcall(ctx context.Context, fn, key string, args ...any) (any, error) {
	return onNode(ctx, s, key, func(c redis.UniversalClient) (any, error) {
		return c.FCall(ctx, fn, []string{key}, args...).Result()
	})
}

// reloadSlots asks a Cluster client to read the cluster's slot map again
// after a call failed without an answer from Redis (the node is down, or
// does not answer in time). go-redis reloads it by itself only on a MOVED
// answer, which a dead master never gives, or once a minute: after a
// failover the promoted replica's slots would fail until then. The reload
// is lazy and rate-limited by go-redis.
func (s *store) reloadSlots(err error) {
	c, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return // Redis answered: the node is up
	}
	c.ReloadState(context.Background())
}

// functionMissing reports whether err is Redis's answer to a call of a
// function that it does not have. Redis gives the error no code of its own,
// only its text.
func functionMissing(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found")
}

// load loads the library where a call on key found it missing: on a
// Cluster, on every master, since the node that answered may not be the
// one that owns key in the client's map (the target of an ASK or MOVED
// redirection while a slot migrates, a replica just promoted), and on the
// node that serves key, should no slot map list it (see nodes.go);
// elsewhere, on the one server a call on key goes to.
func (s *store) load(ctx context.Context, key string) error {
	var node redis.Cmdable = s.client
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return s.loadCluster(ctx, c, key)
	case *redis.Ring:
		shard, err := c.GetShardClientForKey(key)
		if err != nil {
			return err
		}
		node = shard
	}
	return node.FunctionLoadReplace(ctx, s.lib.code).Err()
}

// contextual reports a deadline that passed while the client was busy as
// the context's, whatever the client made of it.
func contextual(ctx context.Context, err error) error {
	if cerr := ended(ctx); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}

// ended returns ctx's error, or context.DeadlineExceeded once ctx's
// deadline has passed: a client that bounds its I/O by the deadline may
// fail a call a moment before ctx itself is done.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// addDur is a + b for durations that are not negative, saturated at the
// longest duration.
func addDur(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

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

func unexpected(reply any) error {
	return fmt.Errorf("unexpected function reply %T", reply)
}

// fromMillis converts ms to a Duration, saturating: a lease or a TTL of
// math.MaxInt64 has more milliseconds left than a Duration holds.
func fromMillis(ms int64) time.Duration {
	const most = math.MaxInt64 / int64(time.Millisecond)
	switch {
	case ms > most:
		return math.MaxInt64
	case ms < -most:
		return math.MinInt64
	}
	return time.Duration(ms) * time.Millisecond
}
