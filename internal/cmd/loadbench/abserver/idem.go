package main

// This file is the only one that imports this module: loadbench puts
// idem_peer.go in its place to serve the peer's middleware, and builds this
// program from a revision that has none with the imports below changed to
// where the revision keeps its stores.

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/redisstore"
)

// middleware returns the middleware on store, at its default options, in
// front of the handler, as an application would set it up.
func middleware(store engine.Store) (http.Handler, error) {
	mw, err := server.New(store)
	if err != nil {
		return nil, err
	}
	return mw.Handler(http.HandlerFunc(handler)), nil
}

// newMemory returns the middleware on a new memstore, and what closes the
// store.
func newMemory() (http.Handler, func(), error) {
	// Bounds far above what a run stores: a store at its bound answers
	// 503, which is not what is measured.
	s, err := memstore.New(memstore.WithMaxRecords(1<<30), memstore.WithMaxBytes(1<<40))
	if err != nil {
		return nil, nil, err
	}
	h, err := middleware(s)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return h, func() { s.Close() }, nil
}

// newPostgres returns the middleware on pgstore, on table, which it
// creates, over a pool configured by cfg.
func newPostgres(ctx context.Context, cfg *pgxpool.Config, table string) (http.Handler, conns, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	s, err := pgstore.New(pool, pgstore.WithTable(table))
	if err == nil {
		err = s.Migrate(ctx)
	}
	var h http.Handler
	if err == nil {
		h, err = middleware(s)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return h, poolConns{pool}, nil
}

// newRedis returns the middleware on redisstore, its keys under prefix.
func newRedis(_ context.Context, client *redis.Client, prefix string) (http.Handler, error) {
	s, err := redisstore.New(client, redisstore.WithPrefix(prefix))
	if err != nil {
		return nil, err
	}
	return middleware(s)
}
