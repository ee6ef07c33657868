package redisstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrEviction is returned, wrapped, by Store.Check and Open when a Redis the
// Store writes to may evict its records: it has a memory limit (maxmemory)
// and a maxmemory-policy other than noeviction. Every record has a TTL, so
// the volatile-* policies evict them as readily as the allkeys-* ones; an
// evicted record is a request that runs again, or a key held by two
// requests at once.
var ErrEviction = errors.New("redis may evict idempotency records")

// Open is New followed by Check, for a process that starts: when a Redis
// may evict the records (ErrEviction), it logs an error that says so and
// returns the Store all the same, or, WithStrictEviction, returns the
// error. A policy it cannot read is logged as a warning (or refused, when
// strict). Only the failure to make the Store is an error otherwise.
func Open(ctx context.Context, client redis.UniversalClient, opts ...Option) (Store, error) {
	st, err := New(client, opts...)
	if err != nil {
		return nil, err
	}
	s := st.(*store)
	err = s.Check(ctx)
	switch {
	case err == nil:
		return s, nil
	case s.strict:
		return nil, err
	case errors.Is(err, ErrEviction):
		s.log().Error("redisstore: an evicting Redis forgets idempotency records: requests that ran run again; set maxmemory-policy noeviction", "err", err)
	default:
		s.log().Warn("redisstore: could not tell whether Redis may evict idempotency records", "err", err)
	}
	return s, nil
}

func (s *store) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}

// Check implements Store.
func (s *store) Check(ctx context.Context) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: check: %w", err)
	}
	// On a Cluster or Ring client without ContextTimeoutEnabled, each node
	// is checked through its clone that bounds its I/O by ctx, and the
	// Cluster client's reading of its slot map, which it does first, is
	// left on a goroutine of its own once ctx ends.
	_, err := bounded(ctx, s.deaf, func() (struct{}, error) { return struct{}{}, s.check(ctx) })
	if err != nil {
		return fmt.Errorf("redisstore: check: %w", err)
	}
	return nil
}

// check checks every master, or shard, of the Store's client.
func (s *store) check(ctx context.Context) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	check := func(ctx context.Context, c *redis.Client) error {
		if s.deaf {
			c = s.hear(c)
		}
		if err := checkNode(ctx, c); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, check)
	case *redis.Ring:
		err = c.ForEachShard(ctx, check)
	case *redis.Client:
		err = check(ctx, c)
	default:
		err = checkPolicy(ctx, s.client, "redis")
	}
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(append(errs, err)...)
}

func checkNode(ctx context.Context, c *redis.Client) error {
	return checkPolicy(ctx, c, c.Options().Addr)
}

// checkPolicy checks the server c talks to, named addr.
func checkPolicy(ctx context.Context, c redis.Cmdable, addr string) error {
	policy, limit, err := memoryPolicy(ctx, c)
	if err != nil {
		return fmt.Errorf("%s: reading maxmemory-policy: %w", addr, err)
	}
	if policy != "noeviction" && limit != 0 {
		return fmt.Errorf("%s: maxmemory-policy %s with maxmemory %d: %w", addr, policy, limit, ErrEviction)
	}
	return nil
}

// memoryPolicy returns the server's maxmemory-policy and maxmemory.
func memoryPolicy(ctx context.Context, c redis.Cmdable) (string, int64, error) {
	cfg, cerr := c.ConfigGet(ctx, "maxmemory*").Result()
	if cerr == nil {
		policy, ok1 := cfg["maxmemory-policy"]
		limit, err := strconv.ParseInt(cfg["maxmemory"], 10, 64)
		if ok1 && err == nil {
			return policy, limit, nil
		}
	}
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return "", 0, errors.Join(cerr, err)
	}
	var policy, limit string
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		switch k {
		case "maxmemory_policy":
			policy = v
		case "maxmemory":
			limit = v
		}
	}
	n, err := strconv.ParseInt(limit, 10, 64)
	if policy == "" || err != nil {
		return "", 0, errors.Join(cerr, errors.New("INFO memory has no maxmemory_policy or maxmemory"))
	}
	return policy, n, nil
}
