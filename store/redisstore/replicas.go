package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
)

// ErrNotReplicated is returned, wrapped, by Claim, Complete and SaveStep on
// a Store made WithReplicaAck when fewer replicas acknowledged the write
// than it asks for. After a Claim, the Store has released the lease it
// took: the request must not run. After a Complete, the response is stored
// on the master, and may be lost if the master fails before a replica has
// it; after a SaveStep, the step.
var ErrNotReplicated = errors.New("fewer redis replicas acknowledged the write than required")

// replicaAck is what WithReplicaAck asks for.
type replicaAck struct {
	replicas int
	timeout  time.Duration
}

// WithReplicaAck makes Claim, Complete and SaveStep wait, after their write, until
// replicas replicas of the master have acknowledged it, for timeout at most:
// WAIT replicas timeout, sent on the same connection as the function, in
// the same round trip (a pipeline). The wait is also bounded by the call's
// context: at most half of what it has left before its deadline (the
// middleware's claim timeout is its store timeout, and at most nine tenths
// of the lease), so that a claim is answered, or released, before the call
// gives up, whatever timeout is given. With fewer acknowledgements, Claim
// releases the lease it took and fails with ErrNotReplicated, so that the
// middleware answers 503 and the handler does not run; the release keeps
// what the record knew (see [Store.Release]), so a takeover of a lost
// holder that is released this way still tells the next claim of that
// holder. Complete fails with ErrNotReplicated, and the middleware applies
// its policy for a Complete that failed; so does SaveStep, and the engine
// tries the step again. A replay or an in-flight answer
// waits for nothing: it wrote nothing.
//
// So a claim that a failover to an acknowledging replica loses is one that
// no handler ran for. See the package documentation (Replication) for what
// it cannot promise, and for min-replicas-to-write, its companion on the
// server. replicas must be at least 1 and timeout more than 0 (WAIT 0
// would wait for ever); timeout is rounded up to whole milliseconds.
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return func(c *config) {
		if replicas < 1 || timeout <= 0 {
			c.refuse("WithReplicaAck(%d, %v): want at least 1 replica and a timeout above 0", replicas, timeout)
			return
		}
		c.ack = replicaAck{replicas: replicas, timeout: time.Duration(millis(timeout)) * time.Millisecond}
	}
}

// callAcked calls fn on the record at key and WAITs on the same connection,
// on the master that owns key, and returns the function's reply and how
// many replicas acknowledged it. It loads the library on the node that
// answered when it lacks it, and follows a Cluster's MOVED and ASK
// redirections itself, since it talks to one node.
func (s *store) callAcked(ctx context.Context, fn, key string, args ...any) (any, int64, error) {
	// The node that a redirection names, and whether it was ASK.
	var redirect string
	var ask bool
	// The clients of nodes that the Cluster client's map does not list.
	var dialed []*redis.Client
	defer func() {
		for _, d := range dialed {
			d.Close()
		}
	}()
	for attempt := 0; ; attempt++ {
		node, fresh, err := s.nodeFor(ctx, key, redirect)
		if err != nil {
			return nil, 0, contextual(ctx, err)
		}
		if fresh {
			dialed = append(dialed, node)
		}
		if s.deaf {
			// A node client of a Cluster or Ring client without
			// ContextTimeoutEnabled: its clone that has it (hearing.go).
			if fresh {
				node = hearingClient(node)
			} else {
				node = s.hear(node)
			}
		}
		var fc, wc *redis.Cmd
		_, err = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if ask {
				p.Do(ctx, "ASKING")
			}
			fc = p.FCall(ctx, fn, []string{key}, args...)
			wc = p.Do(ctx, "WAIT", s.ack.replicas, s.waitTimeout(ctx))
			return nil
		})
		if fc == nil || wc == nil || (err != nil && fc.Err() == nil && wc.Err() == nil) {
			// The pipeline did not run: the context ended first.
			return nil, 0, contextual(ctx, err)
		}
		reply, err := fc.Result()
		if err == nil {
			acked, werr := wc.Int64()
			if werr != nil {
				return reply, 0, contextual(ctx, fmt.Errorf("WAIT: %w", explained(werr)))
			}
			return reply, acked, nil
		}
		// A redirection and a load for each of the tries.
		if attempt >= 2*loadAttempts {
			return nil, 0, contextual(ctx, explained(err))
		}
		if addr, moved := redis.IsMovedError(err); moved {
			// The client's slot map is stale: reload it for the next
			// calls, and follow the redirection for this one.
			redirect, ask = addr, false
			if c, ok := s.client.(*redis.ClusterClient); ok {
				c.ReloadState(ctx)
			}
			continue
		}
		if addr, ok := redis.IsAskError(err); ok {
			redirect, ask = addr, true
			continue
		}
		if functionMissing(err) {
			if err := node.FunctionLoadReplace(ctx, s.lib.code).Err(); err != nil {
				return nil, 0, contextual(ctx, fmt.Errorf("loading the function library: %w", explained(err)))
			}
			continue
		}
		s.reloadSlots(err)
		return nil, 0, contextual(ctx, explained(err))
	}
}

// waitTimeout returns the timeout of the WAIT of a call with ctx, in
// milliseconds: WithReplicaAck's, but at most half of what is left before
// ctx's deadline, so that WAIT answers before the call gives up on its
// answer, with time left for the answer to come back and, after a claim
// that too few replicas acknowledged, for its release. A claim applied
// whose answer never came would be neither answered nor released: its key
// would stay in flight until its lease ended, and the retry would be told
// of an abandoned holder that never ran. At least 1 ms: WAIT 0 waits for
// ever.
func (s *store) waitTimeout(ctx context.Context) int64 {
	wait := s.ack.timeout
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline)/2)
	}
	return max(wait.Milliseconds(), 1)
}

// nodeFor returns the client of the one server that a call on key goes to:
// the master that owns key, or, after a redirection, the node it names. It
// reports whether it made the client for this call, which then closes it:
// the node that a redirection names may be one that the Cluster client's
// map does not list (see nodes.go).
func (s *store) nodeFor(ctx context.Context, key, redirect string) (*redis.Client, bool, error) {
	switch c := s.client.(type) {
	case *redis.Client:
		return c, false, nil
	case *redis.ClusterClient:
		if redirect == "" {
			if s.deaf && !s.mapped.Load() {
				// The client may not have read its slot map yet, and would
				// read it now by its own timeouts: on a goroutine of its
				// own, bounded by ctx (see nodeOf).
				node, err := bounded(ctx, true, func() (*redis.Client, error) { return c.MasterForKey(ctx, key) })
				if err == nil {
					s.mapped.Store(true)
				}
				return node, false, err
			}
			node, err := c.MasterForKey(ctx, key)
			return node, false, err
		}
		var (
			mu         sync.Mutex
			node, like *redis.Client
		)
		// ForEachMaster reads the slot map again first: through the
		// client's own node clients, which bound their I/O by ctx only
		// with ContextTimeoutEnabled. node and like are read only after
		// it returned.
		_, err := bounded(ctx, s.deaf, func() (struct{}, error) {
			return struct{}{}, c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
				mu.Lock()
				defer mu.Unlock()
				if m.Options().Addr == redirect {
					node = m
				}
				like = m
				return nil
			})
		})
		switch {
		case err != nil:
			return nil, false, err
		case node != nil:
			return node, false, nil
		case like == nil:
			return nil, false, fmt.Errorf("no master at %s, named by a redirection", redirect)
		}
		return dialNode(c, like, redirect), true, nil
	case *redis.Ring:
		node, err := c.GetShardClientForKey(key)
		return node, false, err
	}
	return nil, false, fmt.Errorf("WithReplicaAck needs a *redis.Client, *redis.ClusterClient or *redis.Ring, not %T", s.client)
}

// claimAcked is Claim's call WithReplicaAck: a lease that fewer replicas
// acknowledged than asked is released before Claim fails.
func (s *store) claimAcked(ctx context.Context, id engine.ID, key string, args ...any) (any, error) {
	reply, acked, err := s.callAcked(ctx, s.lib.claim, key, args...)
	if reply == nil {
		return nil, err
	}
	c, _, perr := parseClaim(reply)
	if perr != nil || c.Status != engine.Acquired {
		// Nothing was written: there is nothing to wait for.
		return reply, nil
	}
	if err == nil && acked >= int64(s.ack.replicas) {
		return reply, nil
	}
	if err == nil {
		err = fmt.Errorf("%d of %d replicas in %v: %w", acked, s.ack.replicas, s.ack.timeout, ErrNotReplicated)
	} else {
		err = fmt.Errorf("%w: %w", ErrNotReplicated, err)
	}
	// The release gets a context of its own: the claim's may be what ended.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ack.timeout+time.Second)
	defer cancel()
	if rerr := s.Release(rctx, id, c.Token); rerr != nil {
		return nil, fmt.Errorf("%w; releasing the lease: %w", err, rerr)
	}
	return nil, err
}
