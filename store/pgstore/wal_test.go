package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

// TestReplayWritesNoWAL checks a property of the design: a replay, Claim on
// a completed key, by a Store that reads first (as a Store does while more
// than one claim in three finds a record), is a read. It takes no
// transaction ID, so it logs no row, no sequence value and no commit
// record, and it writes nothing to WAL. (A Store that inserts first sends a
// replay's INSERT before its SELECT: it inserts nothing, but takes a value
// of the sequence.)
//
// It checks the very statement that Claim runs, in a transaction of its own,
// because the cluster's WAL position also moves for other sessions and for
// the server's own background records (running-transaction snapshots,
// checkpoints), which would make a before-and-after comparison of
// pg_current_wal_lsn flaky. That comparison is logged, for information.
func TestReplayWritesNoWAL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(servicetest.PostgresURL(t))
	if err != nil {
		servicetest.Unavailable(t, "PostgreSQL", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		servicetest.Unavailable(t, "PostgreSQL", err)
	}
	defer pool.Close()
	suffix := make([]byte, 6)
	rand.Read(suffix)
	table := "pgstore_wal_test_" + hex.EncodeToString(suffix)
	s, err := New(pool, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	id := engine.ID{Scope: "wal", Key: "replayed"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || c.Status != engine.Acquired {
		t.Fatalf("Claim = %v, %v; want acquired", c.Status, err)
	}
	s.(*store).claimPath = claimPathReadFirst
	resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
	if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The first read of the new row may set its hint bits; replays do not.
	replay := func() {
		t.Helper()
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		if err != nil || c.Status != engine.Completed {
			t.Fatalf("replay Claim = %v, %v; want completed", c.Status, err)
		}
	}
	replay()

	var before string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&before); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		replay()
	}
	var walBytes int64
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", before).Scan(&walBytes); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster WAL written during 50 replays, by any session: %d bytes", walBytes)

	args := []any{[]byte(id.Scope), []byte(id.Key)}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var plan []struct {
		Plan struct {
			WALRecords *int64 `json:"WAL Records"`
			WALBytes   *int64 `json:"WAL Bytes"`
		} `json:"Plan"`
	}
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+s.(*store).stmts().read, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if len(plan) != 1 || plan[0].Plan.WALRecords == nil {
		t.Fatalf("EXPLAIN (WAL) gave no WAL counters: %+v", plan)
	}
	if got := *plan[0].Plan.WALRecords; got != 0 {
		t.Errorf("replay statement WAL records = %d (%d bytes), want 0", got, *plan[0].Plan.WALBytes)
	}
	var xid *string
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Errorf("replay statement took transaction ID %s, want none (so no commit record, no flush)", *xid)
	}
	// The sequence was not touched either: the next lease's token follows
	// the first one's directly.
	next := engine.ID{Scope: "wal", Key: "next"}
	c2, err := s.Claim(ctx, next, "fp", time.Minute, time.Hour)
	if err != nil || c2.Status != engine.Acquired {
		t.Fatalf("Claim = %v, %v; want acquired", c2.Status, err)
	}
	if c2.Token != c.Token+1 {
		t.Errorf("token after 52 replays = %d, want %d: replays consumed sequence values", c2.Token, c.Token+1)
	}
}
