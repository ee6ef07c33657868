package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// A call's context bounds its I/O only on a client with
// ContextTimeoutEnabled: without it, go-redis ends a call by the client's
// own timeouts (5 s by default) and a Cluster or Ring client does not even
// see the context. The Store bounds every call by its context all the
// same, on the caller's goroutine: it calls a *redis.Client without it
// through a clone that has it (made once, by New), and a Cluster or Ring
// client's node (the master that owns the key, the Ring's shard) through a
// clone of that node's client that has it, made the first time a call goes
// to that node. A clone shares the connections of the client it was made
// from and runs none of its hooks (go-redis does not copy them).

// maxNodeClones bounds the clones of node clients that a Store keeps: a
// Cluster whose nodes come and go makes new clients, whose clones are made
// again after the Store forgets them all.
const maxNodeClones = 1024

// hearing returns client, or, for a *redis.Client without
// ContextTimeoutEnabled, a clone of it that shares its connections and has
// it, with the client's own timeouts; and it reports whether the client it
// returns still does not bound its I/O by a call's context.
func hearing(client redis.UniversalClient) (redis.UniversalClient, bool) {
	switch c := client.(type) {
	case *redis.Client:
		return hearingClient(c), false
	case *redis.ClusterClient:
		return c, !c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c, !c.Options().ContextTimeoutEnabled
	}
	return client, true
}

// hearingClient returns c, or, without ContextTimeoutEnabled, a clone of c
// that shares its connections and has it, with c's own timeouts.
func hearingClient(c *redis.Client) *redis.Client {
	o := c.Options()
	if o.ContextTimeoutEnabled {
		return c
	}
	// A negative timeout, none at all, skips the connection's deadline, the
	// call's too: 0 is none but the call's.
	clone := c.WithTimeout(max(o.ReadTimeout, 0))
	co := clone.Options()
	co.WriteTimeout = max(o.WriteTimeout, 0)
	co.ContextTimeoutEnabled = true
	return clone
}

// hear returns the clone of node, the client of a node of the Store's
// Cluster or Ring client, that bounds its I/O by a call's context.
func (s *store) hear(node *redis.Client) *redis.Client {
	if c, ok := s.nodes.Load(node); ok {
		return c.(*redis.Client)
	}
	c := hearingClient(node)
	if s.nnodes.Add(1) > maxNodeClones {
		s.nodes.Clear()
		s.nnodes.Store(1)
	}
	if prev, loaded := s.nodes.LoadOrStore(node, c); loaded {
		return prev.(*redis.Client)
	}
	return c
}

// nodeOf returns the client that a call on key goes to on a Cluster or
// Ring client without ContextTimeoutEnabled (see hear), or nil when the
// client cannot tell which without I/O of its own: a Cluster client before
// a call through it has been answered, which may not have read the slot
// map yet.
func (s *store) nodeOf(ctx context.Context, key string) *redis.Client {
	var (
		node *redis.Client
		err  error
	)
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		if !s.mapped.Load() {
			// The client may not have read the slot map yet: it would
			// read it now, on this goroutine, by its own timeouts.
			return nil
		}
		node, err = c.MasterForKey(ctx, key)
	case *redis.Ring:
		node, err = c.GetShardClientForKey(key)
	}
	if err != nil || node == nil {
		return nil
	}
	return s.hear(node)
}

// onNode returns what f returns on the Store's client. On a Cluster or Ring
// client without ContextTimeoutEnabled it calls f on the node that owns key
// (see hear), on the caller's goroutine. Should the node not serve key
// (MOVED or ASK, while a slot migrates or after it moved), f has not run
// there; should its client be closed (the Cluster or Ring dropped the
// node), or the node not answer at all before the context ends (it is
// down, and its replica may be promoted), f may not have run: each time f
// runs again on the Cluster or Ring client, which follows redirections and
// reads the slot map again, on a goroutine of its own (see bounded). Every
// call of the Store is safe to send twice (see functions.go), as go-redis's
// own retries send them.
func onNode[T any](ctx context.Context, s *store, key string, f func(redis.UniversalClient) (T, error)) (T, error) {
	if !s.deaf || ctx.Done() == nil {
		return f(s.client)
	}
	if node := s.nodeOf(ctx, key); node != nil {
		v, err := f(node)
		if !elsewhere(ctx, err) {
			return v, err
		}
	}
	return bounded(ctx, true, func() (T, error) {
		v, err := f(s.client)
		var reply redis.Error
		if err == nil || errors.As(err, &reply) {
			// Redis answered: a Cluster client has a slot map, which it
			// keeps from now on (it reads it again in the background).
			s.mapped.Store(true)
		}
		return v, err
	})
}

// elsewhere reports whether a call that failed with err on a node's client
// may yet succeed through the Cluster or Ring client before ctx ends: the
// node answered that another node serves the key (MOVED, ASK), or did not
// answer at all.
func elsewhere(ctx context.Context, err error) bool {
	if err == nil || ended(ctx) != nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	if _, ok := redis.IsAskError(err); ok {
		return true
	}
	// Any other answer of Redis's, redis.Nil included, is the call's.
	var reply redis.Error
	return !errors.As(err, &reply)
}

// bounded returns what f returns, or, when deaf (a Cluster or Ring client
// that does not bound its I/O by the context), ctx's error as soon as ctx is
// done: f then runs on a goroutine of its own, which the client's own
// timeouts end, so that a Redis that hangs costs no more than the context
// allows.
func bounded[T any](ctx context.Context, deaf bool, f func() (T, error)) (T, error) {
	if !deaf || ctx.Done() == nil {
		return f()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}
