package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A Cluster client knows the masters of its slot map, which lists only the
// nodes that own slots. A master added with CLUSTER MEET owns none until a
// slot migrates to it, and during the migration the source answers the
// calls of the keys it no longer holds with an ASK redirection to it, which
// the client follows with a client of its own that nothing else can reach.
// (redis-cli --cluster add-node copies the functions to the node it adds;
// CLUSTER MEET does not.) So where the library is missing, the Store looks
// for the node that serves the key itself, and connects to it when the map
// does not list it.

// loadCluster loads the library on every master of the client's slot map,
// which it reads again first, and on the node that serves key when the map
// does not list it.
func (s *store) loadCluster(ctx context.Context, c *redis.ClusterClient, key string) error {
	var (
		mu     sync.Mutex
		loaded = make(map[string]bool)
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		loaded[m.Options().Addr] = true
		mu.Unlock()
		return m.FunctionLoadReplace(ctx, s.lib.code).Err()
	})
	if err != nil {
		return err
	}
	node, err := c.MasterForKey(ctx, key)
	if err != nil {
		return err
	}
	addr, ok := servedBy(ctx, node, key)
	if !ok || loaded[addr] {
		return nil
	}
	other := dialNode(c, node, addr)
	defer other.Close()
	return other.FunctionLoadReplace(ctx, s.lib.code).Err()
}

// servedBy asks the master of key, node, whether another node serves key:
// a keyed command that reads only the key's expiry, PTTL, is answered with
// an ASK redirection while the key's slot migrates and the key is not on
// node, and with a MOVED one when the slot has moved. It reports the
// address that a redirection names, and false when there is none, or when
// node could not answer (the call that follows will say why).
func servedBy(ctx context.Context, node *redis.Client, key string) (string, bool) {
	err := node.PTTL(ctx, key).Err()
	if addr, ok := redis.IsAskError(err); ok {
		return addr, true
	}
	return redis.IsMovedError(err)
}

// dialNode returns a client of the Cluster node at addr, with the settings
// that c gives the clients of its nodes, like's; the caller closes it.
func dialNode(c *redis.ClusterClient, like *redis.Client, addr string) *redis.Client {
	opt := *like.Options()
	opt.Addr = addr
	opt.NodeAddress = ""
	// Each client has its own (go-redis clones it the same way).
	if m := opt.MaintNotificationsConfig; m != nil {
		mc := *m
		opt.MaintNotificationsConfig = &mc
	}
	// A command or two: no idle connections kept, none opened ahead.
	opt.MinIdleConns = 0
	if f := c.Options().NewClient; f != nil {
		return f(&opt)
	}
	return redis.NewClient(&opt)
}
