package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The minimal statements are what a store does at the least for a key
// (-minimal): for a first execution, store the key as taken, then its
// response; for a replay, read the response. On Redis, SET NX PX then
// SET XX PX, and GET; on PostgreSQL, INSERT … ON CONFLICT DO NOTHING then
// UPDATE, and SELECT, on a plain table of their own (the primary key, no
// other index); in memory, a map under a mutex. They check nothing that the
// middleware checks (a lease, a token, a record's state, its expiry): they
// are the floor that the stores are measured against, not a protocol. So
// that a replay is one statement, the handler is told before each phase
// which path its requests take (/loadbench/kind), where a protocol would
// find out from the store.

// Lifetimes of the minimal records: a key taken, and a response kept.
const (
	minimalLease = time.Minute
	minimalTTL   = 24 * time.Hour
)

// minimalStore keeps records by key.
type minimalStore interface {
	// claim takes key for the holder of token, unless it has a record.
	claim(ctx context.Context, key string, fp []byte, token int64) (bool, error)
	// complete stores the response of key.
	complete(ctx context.Context, key string, fp []byte, token int64, status int, body []byte) error
	// lookup returns key's fingerprint and response; found is false when
	// it has none.
	lookup(ctx context.Context, key string) (fp []byte, status int, body []byte, found bool, err error)
}

// minimal serves the handler through a minimalStore.
type minimal struct {
	st     minimalStore
	replay atomic.Bool
}

func (m *minimal) setReplay(replay bool) { m.replay.Store(replay) }

func (m *minimal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if err != nil || key == "" {
		http.Error(w, "a key and a body", http.StatusBadRequest)
		return
	}
	sum := sha256.New()
	io.WriteString(sum, r.Method+" "+r.URL.RequestURI()+"\n")
	sum.Write(body)
	fp := sum.Sum(nil)
	ctx := r.Context()
	if m.replay.Load() {
		sfp, status, stored, found, err := m.st.lookup(ctx, key)
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case !found:
			http.Error(w, "no record", http.StatusNotFound)
		case !bytes.Equal(sfp, fp):
			http.Error(w, "another request", http.StatusUnprocessableEntity)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			w.Write(stored)
		}
		return
	}
	token := rand.Int64()
	ok, err := m.st.claim(ctx, key, fp, token)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	if !ok {
		http.Error(w, "taken", http.StatusConflict)
		return
	}
	c := &capture{header: http.Header{}}
	r.Body = io.NopCloser(bytes.NewReader(body))
	handler(c, r)
	if err := m.st.complete(ctx, key, fp, token, c.status, c.body.Bytes()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	for k, v := range c.header {
		w.Header()[k] = v
	}
	w.WriteHeader(c.status)
	w.Write(c.body.Bytes())
}

// capture keeps a response.
type capture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *capture) Write(p []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.body.Write(p)
}

// newMinimalMemory returns the minimal statements on a map.
func newMinimalMemory() (http.Handler, func(), error) {
	return &minimal{st: &memoryMinimal{m: map[string]*memoryRecord{}}}, func() {}, nil
}

type memoryRecord struct {
	fp     []byte
	token  int64
	status int
	body   []byte
}

type memoryMinimal struct {
	mu sync.Mutex
	m  map[string]*memoryRecord
}

func (s *memoryMinimal) claim(_ context.Context, key string, fp []byte, token int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[key]; ok {
		return false, nil
	}
	s.m[key] = &memoryRecord{fp: fp, token: token}
	return true, nil
}

func (s *memoryMinimal) complete(_ context.Context, key string, _ []byte, token int64, status int, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.m[key]; ok && r.token == token {
		r.status, r.body = status, bytes.Clone(body)
	}
	return nil
}

func (s *memoryMinimal) lookup(_ context.Context, key string) ([]byte, int, []byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[key]
	if !ok || r.status == 0 {
		return nil, 0, nil, false, nil
	}
	return r.fp, r.status, r.body, true, nil
}

// newMinimalRedis returns the minimal statements on Redis: SET NX PX and
// SET XX PX for a first execution, GET for a replay. A record is its
// fingerprint (32 bytes), its token (8), its status (2) and its body.
func newMinimalRedis(client *redis.Client, prefix string) (http.Handler, error) {
	return &minimal{st: &redisMinimal{c: client, prefix: prefix}}, nil
}

type redisMinimal struct {
	c      *redis.Client
	prefix string
}

func (s *redisMinimal) claim(ctx context.Context, key string, fp []byte, token int64) (bool, error) {
	v := binary.BigEndian.AppendUint64(bytes.Clone(fp), uint64(token))
	err := s.c.SetArgs(ctx, s.prefix+key, v, redis.SetArgs{Mode: "NX", TTL: minimalLease}).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}

func (s *redisMinimal) complete(ctx context.Context, key string, fp []byte, token int64, status int, body []byte) error {
	v := make([]byte, 0, len(fp)+10+len(body))
	v = append(v, fp...)
	v = binary.BigEndian.AppendUint64(v, uint64(token))
	v = binary.BigEndian.AppendUint16(v, uint16(status))
	v = append(v, body...)
	return s.c.SetArgs(ctx, s.prefix+key, v, redis.SetArgs{Mode: "XX", TTL: minimalTTL}).Err()
}

func (s *redisMinimal) lookup(ctx context.Context, key string) ([]byte, int, []byte, bool, error) {
	b, err := s.c.Get(ctx, s.prefix+key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, 0, nil, false, nil
	}
	if err != nil {
		return nil, 0, nil, false, err
	}
	if len(b) < sha256.Size+10 {
		return nil, 0, nil, false, nil // still in flight
	}
	return b[:sha256.Size], int(binary.BigEndian.Uint16(b[sha256.Size+8:])), b[sha256.Size+10:], true, nil
}

// newMinimalPostgres returns the minimal statements on PostgreSQL: INSERT …
// ON CONFLICT DO NOTHING and UPDATE for a first execution, SELECT for a
// replay, each prepared (pgx's statement cache), on table, which it creates:
// the columns a record needs, the primary key (scope, key), no other index.
func newMinimalPostgres(ctx context.Context, cfg *pgxpool.Config, table string) (http.Handler, conns, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	t := pgx.Identifier{table}.Sanitize()
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
		scope       bytea       NOT NULL,
		key         bytea       NOT NULL,
		fingerprint bytea       NOT NULL,
		token       bigint      NOT NULL,
		expiry      timestamptz NOT NULL,
		status      integer,
		body        bytea,
		PRIMARY KEY (scope, key))`)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("creating the table: %w", err)
	}
	st := &postgresMinimal{
		pool:    pool,
		insert:  `INSERT INTO ` + t + ` (scope, key, fingerprint, token, expiry) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		update:  `UPDATE ` + t + ` SET status = $4, body = $5, expiry = $6 WHERE scope = $1 AND key = $2 AND token = $3`,
		selectQ: `SELECT fingerprint, token, expiry, status, body FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		noScope: []byte{},
	}
	return &minimal{st: st}, poolConns{pool}, nil
}

type postgresMinimal struct {
	pool                    *pgxpool.Pool
	insert, update, selectQ string
	// noScope is the scope of a request without credentials.
	noScope []byte
}

func (s *postgresMinimal) claim(ctx context.Context, key string, fp []byte, token int64) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.insert, s.noScope, []byte(key), fp, token, time.Now().Add(minimalLease))
	return err == nil && tag.RowsAffected() == 1, err
}

func (s *postgresMinimal) complete(ctx context.Context, key string, _ []byte, token int64, status int, body []byte) error {
	_, err := s.pool.Exec(ctx, s.update, s.noScope, []byte(key), token, status, body, time.Now().Add(minimalTTL))
	return err
}

func (s *postgresMinimal) lookup(ctx context.Context, key string) ([]byte, int, []byte, bool, error) {
	var (
		fp, body []byte
		token    int64
		expiry   time.Time
		status   *int32
	)
	err := s.pool.QueryRow(ctx, s.selectQ, s.noScope, []byte(key)).Scan(&fp, &token, &expiry, &status, &body)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && status == nil) {
		return nil, 0, nil, false, nil
	}
	if err != nil {
		return nil, 0, nil, false, err
	}
	return fp, int(*status), body, true, nil
}

// poolConns are a pgx pool's connections.
type poolConns struct{ pool *pgxpool.Pool }

// open acquires n connections at once, which makes the pool open them,
// and gives them back.
func (p poolConns) open(ctx context.Context, n int) error {
	held := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range n {
		c, err := p.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		held = append(held, c)
	}
	return nil
}

func (p poolConns) closeAll() { p.pool.Reset() }
