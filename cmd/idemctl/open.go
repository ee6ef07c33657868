package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/redisstore"
)

// The kinds of store.
const (
	kindPostgres = "PostgreSQL"
	kindRedis    = "Redis"
)

// storeConfig names a store: its URL, which may hold a password, and the
// flags that place its records.
type storeConfig struct {
	url     string
	kind    string // set by classify
	table   string
	prefix  string
	cluster bool
}

// classify sets c.kind from the URL's scheme, and checks that the flags
// given are for that kind.
func (c *storeConfig) classify() error {
	scheme, _, ok := strings.Cut(c.url, "://")
	if !ok {
		return errors.New("the store is not a URL: want a postgres:// or redis:// URL")
	}
	scheme = strings.ToLower(scheme)
	switch scheme {
	case "postgres", "postgresql":
		c.kind = kindPostgres
		if c.prefix != "" || c.cluster {
			return errors.New("-prefix and -cluster are for a Redis store; this one is PostgreSQL")
		}
	case "redis", "rediss", "unix":
		c.kind = kindRedis
		if c.table != "" {
			return errors.New("-table is for a PostgreSQL store; this one is Redis")
		}
		if c.cluster && scheme == "unix" {
			return errors.New("-cluster needs a redis:// or rediss:// URL")
		}
	default:
		// The scheme only: the rest may hold a password.
		return fmt.Errorf("store scheme %q: want postgres, postgresql, redis, rediss or unix", scheme)
	}
	return nil
}

// secrets returns the passwords that the URL holds, in every form an error
// message might quote them.
func (c *storeConfig) secrets() []string {
	var out []string
	add := func(s string) {
		if s != "" {
			out = append(out, s, url.QueryEscape(s), url.PathEscape(s))
		}
	}
	u, err := url.Parse(c.url)
	if err != nil {
		// Unparsable: all that can be done is to hide the whole of it
		// and whatever follows its scheme.
		_, rest, _ := strings.Cut(c.url, "://")
		add(rest)
		return out
	}
	if pw, ok := u.User.Password(); ok {
		add(pw)
	}
	for _, name := range []string{"password", "sslpassword"} {
		add(u.Query().Get(name))
	}
	return out
}

// redact returns err's message with the URL and every password in it
// replaced.
func (c *storeConfig) redact(err error) string {
	msg := err.Error()
	if c.url == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, c.url, c.describe())
	for _, s := range c.secrets() {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}

// describe names the store without its credentials.
func (c *storeConfig) describe() string {
	u, err := url.Parse(c.url)
	if err != nil {
		return c.kind + " store"
	}
	where := u.Host + u.Path
	if u.Scheme == "unix" {
		where = u.Path
	}
	return c.kind + " at " + where
}

// openStore connects to the store that c names, and checks that it answers.
func openStore(ctx context.Context, c storeConfig) (engine.Store, func(), error) {
	if c.kind == kindPostgres {
		return openPostgres(ctx, c)
	}
	return openRedis(ctx, c)
}

func openPostgres(ctx context.Context, c storeConfig) (engine.Store, func(), error) {
	cfg, err := pgxpool.ParseConfig(c.url)
	if err != nil {
		return nil, nil, fmt.Errorf("the PostgreSQL URL cannot be parsed: %w", err)
	}
	// One operator's command needs one connection.
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", c.describe(), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("connect to %s: %w", c.describe(), err)
	}
	var opts []pgstore.Option
	if c.table != "" {
		opts = append(opts, pgstore.WithTable(c.table))
	}
	s, err := pgstore.New(pool, opts...)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, func() { s.Close(); pool.Close() }, nil
}

func openRedis(ctx context.Context, c storeConfig) (engine.Store, func(), error) {
	var client redis.UniversalClient
	if c.cluster {
		opts, err := redis.ParseClusterURL(c.url)
		if err != nil {
			return nil, nil, fmt.Errorf("the Redis Cluster URL cannot be parsed: %w", err)
		}
		opts.ContextTimeoutEnabled = true
		client = redis.NewClusterClient(opts)
	} else {
		opts, err := redis.ParseURL(c.url)
		if err != nil {
			return nil, nil, fmt.Errorf("the Redis URL cannot be parsed: %w", err)
		}
		opts.ContextTimeoutEnabled = true
		client = redis.NewClient(opts)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("connect to %s: %w", c.describe(), err)
	}
	var opts []redisstore.Option
	if c.prefix != "" {
		opts = append(opts, redisstore.WithPrefix(c.prefix))
	}
	s, err := redisstore.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return s, func() { client.Close() }, nil
}
