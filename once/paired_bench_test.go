//go:build unix

package once_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
)

// BenchmarkPaired compares the function door with the least that a
// hand-written pattern does for the same call, on each store, in one run:
// the input encoded (JSON) and hashed (SHA-256), the key taken, the function
// run, its result encoded and stored; a replay reads the result, compares
// the input's hash and decodes the result. The hand-written pattern checks
// nothing else (no lease, no token, no expiry, no state) and knows which
// path a call takes, as the load tool's minimal statements do: in memory a
// map under a mutex; on Redis SET NX PX then SET XX PX, and GET; on
// PostgreSQL INSERT … ON CONFLICT DO NOTHING then UPDATE, and SELECT, on a
// plain table of its own (scope, key, fingerprint, token, expiry, status,
// body; the primary key, no other index), each prepared, with the server's
// own synchronous_commit.
//
// Each iteration runs every kind (the door's first execution, the pattern's,
// the door's replay, the pattern's) on one goroutine, in rounds of
// pairedRound calls of each kind that take turns, so that the load of a
// shared machine falls on all alike. It reports each kind's time and
// process CPU (getrusage) per call, and the door's over the pattern's.
//
//	go test ./once -run '^$' -bench BenchmarkPaired -benchtime 2000x -count 3
func BenchmarkPaired(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		runPaired(b, teststores.Memory(b), &memoryHand{m: map[string]*memoryHandRecord{}})
	})
	b.Run("redis", func(b *testing.B) {
		c := teststores.RedisClient(b)
		prefix := teststores.UniqueName(b, "idempotency-t:") + ":"
		s := teststores.RedisOn(b, c, prefix)
		runPaired(b, s, &redisHand{c: c, prefix: prefix + "hand:"})
	})
	b.Run("postgres", func(b *testing.B) {
		pool := pairedPool(b)
		s := teststores.PostgresOn(b, pool, teststores.UniqueName(b, "idempotency_t_"))
		runPaired(b, s, newPostgresHand(b, pool))
	})
}

// pairedRound is how many calls of each kind a round runs.
const pairedRound = 50

// handPattern is the hand-written pattern on one store: claim takes a new
// key, complete stores its result, replay reads the stored result.
type handPattern interface {
	claim(ctx context.Context, key string, fp [sha256.Size]byte) (token int64, err error)
	complete(ctx context.Context, key string, fp [sha256.Size]byte, token int64, body []byte) error
	replay(ctx context.Context, key string) (fp []byte, body []byte, err error)
}

type pairedInput struct {
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

type pairedResult struct {
	ID     int    `json:"id"`
	Status string `json:"status"`
}

func pairedFn(context.Context) (pairedResult, error) {
	return pairedResult{ID: 42, Status: "created"}, nil
}

// handDo is the hand-written pattern's call, on either path.
func handDo(ctx context.Context, h handPattern, key string, input pairedInput, replay bool) (pairedResult, error) {
	in, err := json.Marshal(input)
	if err != nil {
		return pairedResult{}, err
	}
	fp := sha256.Sum256(in)
	if replay {
		stored, body, err := h.replay(ctx, key)
		if err != nil {
			return pairedResult{}, err
		}
		if string(stored) != string(fp[:]) {
			return pairedResult{}, errors.New("another input")
		}
		var v pairedResult
		err = json.Unmarshal(body, &v)
		return v, err
	}
	token, err := h.claim(ctx, key, fp)
	if err != nil {
		return pairedResult{}, err
	}
	v, err := pairedFn(ctx)
	if err != nil {
		return v, err
	}
	body, err := json.Marshal(v)
	if err != nil {
		return v, err
	}
	return v, h.complete(ctx, key, fp, token, body)
}

func runPaired(b *testing.B, s engine.Store, h handPattern) {
	ctx := context.Background()
	r, err := once.New(s)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Shutdown(ctx)
	input := pairedInput{Amount: 1200, Currency: "EUR"}
	replayID := engine.ID{Scope: "bench", Key: "replayed"}
	if _, err := once.Do(ctx, r, replayID, input, pairedFn); err != nil {
		b.Fatal(err)
	}
	if _, err := handDo(ctx, h, "replayed", input, false); err != nil {
		b.Fatal(err)
	}
	next := 0
	kinds := []struct {
		name string
		op   func() error
	}{
		{"door-first", func() error {
			next++
			_, err := once.Do(ctx, r, engine.ID{Scope: "bench", Key: "k" + strconv.Itoa(next)}, input, pairedFn)
			return err
		}},
		{"hand-first", func() error {
			next++
			_, err := handDo(ctx, h, "k"+strconv.Itoa(next), input, false)
			return err
		}},
		{"door-replay", func() error {
			v, replayed, err := once.DoResult(ctx, r, replayID, input, pairedFn)
			if err == nil && (!replayed || v.ID != 42) {
				err = errors.New("not replayed")
			}
			return err
		}},
		{"hand-replay", func() error {
			v, err := handDo(ctx, h, "replayed", input, true)
			if err == nil && v.ID != 42 {
				err = errors.New("not replayed")
			}
			return err
		}},
	}
	// Warm up: connections, prepared statements, the functions' library.
	for range pairedRound {
		for _, k := range kinds {
			if err := k.op(); err != nil {
				b.Fatalf("%s: %v", k.name, err)
			}
		}
	}
	wall := make([]time.Duration, len(kinds))
	cpu := make([]time.Duration, len(kinds))
	b.ResetTimer()
	for done := 0; done < b.N; done += pairedRound {
		n := min(pairedRound, b.N-done)
		for i, k := range kinds {
			c0, t0 := processCPU(b), time.Now()
			for range n {
				if err := k.op(); err != nil {
					b.Fatalf("%s: %v", k.name, err)
				}
			}
			wall[i] += time.Since(t0)
			cpu[i] += processCPU(b) - c0
		}
	}
	b.StopTimer()
	perCall := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
	for i, k := range kinds {
		b.ReportMetric(perCall(wall[i]), k.name+"-µs/op")
		b.ReportMetric(perCall(cpu[i]), k.name+"-cpu-µs/op")
	}
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }
	b.ReportMetric(ratio(wall[0], wall[1]), "first-door/hand")
	b.ReportMetric(ratio(cpu[0], cpu[1]), "first-cpu-door/hand")
	b.ReportMetric(ratio(wall[2], wall[3]), "replay-door/hand")
	b.ReportMetric(ratio(cpu[2], cpu[3]), "replay-cpu-door/hand")
}

// processCPU returns the CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memoryHand is the pattern in memory: a map under a mutex.
type memoryHand struct {
	mu sync.Mutex
	m  map[string]*memoryHandRecord
}

type memoryHandRecord struct {
	fp   [sha256.Size]byte
	done bool
	body []byte
}

func (h *memoryHand) claim(_ context.Context, key string, fp [sha256.Size]byte) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.m[key]; ok {
		return 0, errors.New("taken")
	}
	h.m[key] = &memoryHandRecord{fp: fp}
	return 0, nil
}

func (h *memoryHand) complete(_ context.Context, key string, _ [sha256.Size]byte, _ int64, body []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	rec := h.m[key]
	rec.body, rec.done = body, true
	return nil
}

func (h *memoryHand) replay(_ context.Context, key string) ([]byte, []byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rec, ok := h.m[key]
	if !ok || !rec.done {
		return nil, nil, errors.New("no result")
	}
	return rec.fp[:], rec.body, nil
}

// redisHand is the pattern on Redis: SET NX PX of the input's hash, then
// SET XX PX of the hash and the result; GET.
type redisHand struct {
	c      *redis.Client
	prefix string
}

func (h *redisHand) claim(ctx context.Context, key string, fp [sha256.Size]byte) (int64, error) {
	return 0, h.c.SetArgs(ctx, h.prefix+key, fp[:], redis.SetArgs{Mode: "NX", TTL: time.Minute}).Err()
}

func (h *redisHand) complete(ctx context.Context, key string, fp [sha256.Size]byte, _ int64, body []byte) error {
	return h.c.SetArgs(ctx, h.prefix+key, append(fp[:], body...), redis.SetArgs{Mode: "XX", TTL: 24 * time.Hour}).Err()
}

func (h *redisHand) replay(ctx context.Context, key string) ([]byte, []byte, error) {
	v, err := h.c.Get(ctx, h.prefix+key).Bytes()
	if err != nil {
		return nil, nil, err
	}
	if len(v) <= sha256.Size {
		return nil, nil, errors.New("no result")
	}
	return v[:sha256.Size], v[sha256.Size:], nil
}

// postgresHand is the pattern on PostgreSQL, on a plain table of its own.
type postgresHand struct {
	pool                    *pgxpool.Pool
	insert, update, selectQ string
}

func newPostgresHand(b *testing.B, pool *pgxpool.Pool) *postgresHand {
	table := teststores.UniqueName(b, "idempotency_hand_")
	t := pgx.Identifier{table}.Sanitize()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+t+` (
		scope bytea NOT NULL, key bytea NOT NULL, fingerprint bytea NOT NULL, token bigint NOT NULL,
		expires_at timestamptz NOT NULL, status integer, body bytea, PRIMARY KEY (scope, key))`); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+t) })
	return &postgresHand{
		pool:    pool,
		insert:  `INSERT INTO ` + t + ` (scope, key, fingerprint, token, expires_at) VALUES ($1, $2, $3, $4, now() + interval '1 minute') ON CONFLICT DO NOTHING`,
		update:  `UPDATE ` + t + ` SET status = $4, body = $5, expires_at = now() + interval '1 day' WHERE scope = $1 AND key = $2 AND token = $3`,
		selectQ: `SELECT fingerprint, status, body FROM ` + t + ` WHERE scope = $1 AND key = $2`,
	}
}

func (h *postgresHand) claim(ctx context.Context, key string, fp [sha256.Size]byte) (int64, error) {
	token := time.Now().UnixNano()
	tag, err := h.pool.Exec(ctx, h.insert, []byte("bench"), []byte(key), fp[:], token)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("taken")
	}
	return token, err
}

func (h *postgresHand) complete(ctx context.Context, key string, _ [sha256.Size]byte, token int64, body []byte) error {
	_, err := h.pool.Exec(ctx, h.update, []byte("bench"), []byte(key), token, int32(200), body)
	return err
}

func (h *postgresHand) replay(ctx context.Context, key string) ([]byte, []byte, error) {
	var (
		fp, body []byte
		status   *int32
	)
	if err := h.pool.QueryRow(ctx, h.selectQ, []byte("bench"), []byte(key)).Scan(&fp, &status, &body); err != nil {
		return nil, nil, err
	}
	if status == nil {
		return nil, nil, errors.New("no result")
	}
	return fp, body, nil
}

// pairedPool is a pool on the test database with the server's own
// synchronous_commit (teststores turns it off for tests), closed when b
// ends.
func pairedPool(b *testing.B) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(servicetest.PostgresURL(b))
	if err != nil {
		b.Fatalf("%s is not a PostgreSQL URL", servicetest.EnvPostgresURL)
	}
	cfg.MaxConns = 4
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		servicetest.Unavailable(b, "PostgreSQL", err)
	}
	b.Cleanup(pool.Close)
	return pool
}
