//go:build ignore

// This file is not part of this module's build. loadbench's A/B mode puts
// it in place of idem.go, in a module of its own whose go.mod replaces the
// peer's modules (github.com/repenguin22/idemlease, its pgstore and its
// redistore) with the directories of -peer-dir, to serve the peer's
// middleware, httpidem, at its default options, on the peer's own stores,
// with the same clients and the same pool sizes as this module's.

package main

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/repenguin22/idemlease"
	"github.com/repenguin22/idemlease/httpidem"
	"github.com/repenguin22/idemlease/memstore"
	"github.com/repenguin22/idemlease/pgstore"
	"github.com/repenguin22/idemlease/redistore"
)

func middleware(store idemlease.Store) http.Handler {
	return httpidem.New(store)(http.HandlerFunc(handler))
}

func newMemory() (http.Handler, func(), error) {
	return middleware(memstore.New()), func() {}, nil
}

// newPostgres serves the peer's pgstore, which takes a *sql.DB: pgx's
// database/sql driver, over the same connections as this module's pool
// would open (cfg's), as many, and all of them kept when idle
// (database/sql keeps 2 by default, and would reconnect under load).
func newPostgres(ctx context.Context, cfg *pgxpool.Config, table string) (http.Handler, conns, error) {
	db := stdlib.OpenDB(*cfg.ConnConfig)
	n := int(cfg.MaxConns)
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	if _, err := db.ExecContext(ctx, pgstore.Schema(table)); err != nil {
		db.Close()
		return nil, nil, err
	}
	return middleware(pgstore.New(db, pgstore.Table(table))), dbConns{db, n}, nil
}

func newRedis(_ context.Context, client *redis.Client, prefix string) (http.Handler, error) {
	return middleware(redistore.New(client, redistore.KeyPrefix(prefix))), nil
}

// dbConns are a database/sql pool's connections.
type dbConns struct {
	db *sql.DB
	n  int
}

func (d dbConns) open(ctx context.Context, n int) error {
	held := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range n {
		c, err := d.db.Conn(ctx)
		if err != nil {
			return err
		}
		if err := c.PingContext(ctx); err != nil {
			c.Close()
			return err
		}
		held = append(held, c)
	}
	return nil
}

// closeAll closes the idle connections: keeping none closes them.
func (d dbConns) closeAll() {
	d.db.SetMaxIdleConns(0)
	d.db.SetMaxIdleConns(d.n)
}
