package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/sqlitestore"
	"github.com/idemkit/idempotency/store/storetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(claimerProcess())
	}
	goleak.VerifyTestMain(m)
}

func open(t testing.TB, path string, opts ...sqlitestore.Option) sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), path, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	storetest.Run(t, func(t *testing.T) engine.Store { return s })
}

func TestOpenRejects(t *testing.T) {
	for _, path := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		_, err := sqlitestore.Open(context.Background(), path)
		require.Error(t, err, "Open(%q)", path)
		assert.True(t, strings.HasPrefix(err.Error(), "sqlitestore: "), "error %q lacks the package prefix", err)
	}
}

func created(body string) *engine.Response {
	return &engine.Response{Status: http.StatusCreated, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

func acquire(t testing.TB, s engine.Store, id engine.ID, lease time.Duration) engine.Token {
	t.Helper()
	c, err := s.Claim(context.Background(), id, "fp", lease, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status, "Claim(%v)", id)
	return c.Token
}

// A record outlives its process: a completed one replays after the file is
// opened again, and one whose holder died with its process is taken over,
// with the lost holder counted.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "records.db")
	s, err := sqlitestore.Open(ctx, path)
	require.NoError(t, err)
	done, lost := engine.ID{Key: "done"}, engine.ID{Key: "lost"}
	require.NoError(t, s.Complete(ctx, done, acquire(t, s, done, time.Minute), created(`{"id":1}`), time.Hour))
	tok := acquire(t, s, lost, 50*time.Millisecond)
	require.NoError(t, s.Close())

	s = open(t, path)
	c, err := s.Claim(ctx, done, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, c.Status)
	assert.Equal(t, `{"id":1}`, string(c.Response.Body))
	require.Eventually(t, func() bool {
		c, err = s.Claim(ctx, lost, "fp", time.Minute, time.Hour)
		return err == nil && c.Status == engine.Acquired
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, c.Abandoned, "Abandoned after the holder's process ended")
	assert.Greater(t, c.Token, tok)
	assert.ErrorIs(t, s.Complete(ctx, lost, tok, created(`{}`), time.Hour), engine.ErrLeaseLost)
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "records.db"))
	require.NoError(t, err)
	id := engine.ID{Key: "k"}
	tok := acquire(t, s, id, time.Minute)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "a second Close")
	_, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	assert.ErrorIs(t, err, engine.ErrStoreClosed)
	assert.ErrorIs(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour), engine.ErrStoreClosed)
}

// Tokens never go back: released, forgotten or swept, a key's next token
// is larger, and the sweeper never deletes the record with the largest
// token, whose rowid the next would otherwise take again.
func TestTokensAfterDelete(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	sqlitestore.FirstSwept(s)
	id := engine.ID{Key: "k"}
	count := func(where string, args ...any) int {
		var n int
		require.NoError(t, s.DB().QueryRowContext(ctx, "SELECT count(*) FROM idempotency_records WHERE "+where, args...).Scan(&n))
		return n
	}
	last := engine.Token(0)
	for i := range 4 {
		// The sweeper may delete a completed record once its claim's
		// expiry, the lease's end, has passed.
		c, err := s.Claim(ctx, id, "fp", time.Second, time.Nanosecond)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status)
		require.Greater(t, c.Token, last, "token %d", i)
		last = c.Token
		switch i {
		case 0:
			require.NoError(t, s.Release(ctx, id, c.Token))
		case 1:
			require.NoError(t, s.Resolve(ctx, id, nil, 0))
		case 2:
			require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Nanosecond))
			other := engine.ID{Key: "other"} // now the largest token
			c, err := s.Claim(ctx, other, "fp", time.Second, time.Nanosecond)
			require.NoError(t, err)
			require.NoError(t, s.Complete(ctx, other, c.Token, created(`{}`), time.Nanosecond))
			require.Eventually(t, func() bool {
				sqlitestore.Sweep(ctx, s, 10)
				return count("key = ?", []byte("k")) == 0
			}, 5*time.Second, time.Millisecond)
		}
	}
	require.NoError(t, s.Complete(ctx, id, last, created(`{}`), time.Nanosecond))
	require.Eventually(t, func() bool {
		sqlitestore.Sweep(ctx, s, 10)
		return count("TRUE") == 1 && count("sweep_at <= ?", time.Now().UnixMicro()) == 1
	}, 5*time.Second, time.Millisecond)

	assert.Zero(t, sqlitestore.Sweep(ctx, s, 10), "records swept")
	assert.Equal(t, 1, count("token = ?", int64(last)), "the record left is the last one claimed")
}

func TestSweep(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	sqlitestore.FirstSwept(s) // the sweeper's, which would take some of these
	for i := range 25 {
		id := engine.ID{Key: fmt.Sprint("short-", i)}
		c, err := s.Claim(ctx, id, "fp", time.Second, time.Millisecond) // swept a second on
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Millisecond))
	}
	keep := engine.ID{Key: "kept"}
	require.NoError(t, s.Complete(ctx, keep, acquire(t, s, keep, time.Minute), created(`{}`), time.Hour))
	var swept int64
	require.Eventually(t, func() bool {
		swept += sqlitestore.Sweep(ctx, s, 10) // batches of 10: three of them
		return swept == 25
	}, 5*time.Second, time.Millisecond)
	var n int
	require.NoError(t, s.DB().QueryRow("SELECT count(*) FROM idempotency_records").Scan(&n))
	assert.Equal(t, 1, n, "records left")
	_, err := s.Lookup(ctx, keep)
	assert.NoError(t, err)
}

// The file is in WAL mode, with the synchronous setting asked for.
func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		opts []sqlitestore.Option
		sync int
	}{{nil, 1}, {[]sqlitestore.Option{sqlitestore.WithFullSync()}, 2}} {
		s := open(t, filepath.Join(t.TempDir(), "records.db"), tc.opts...)
		var mode string
		var sync int
		require.NoError(t, s.DB().QueryRow("PRAGMA journal_mode").Scan(&mode))
		require.NoError(t, s.DB().QueryRow("PRAGMA synchronous").Scan(&sync))
		assert.Equal(t, "wal", mode)
		assert.Equal(t, tc.sync, sync, "synchronous (1 NORMAL, 2 FULL)")
	}
}

func TestNotStorable(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	id := engine.ID{Key: "k"}
	tok := acquire(t, s, id, time.Minute)
	err := s.Complete(ctx, id, tok, &engine.Response{Status: 70000}, time.Hour)
	assert.ErrorIs(t, err, engine.ErrNotStorable)
	require.NoError(t, s.Complete(ctx, id, tok, created(`{}`), time.Hour))
}

// helperEnv makes the test binary a claimer process (claimerProcess).
const helperEnv = "SQLITESTORE_TEST_CLAIMER"

// claimerProcess claims keys k0…k(n-1) of the file in SQLITESTORE_TEST_FILE
// with 8 goroutines, completes those it acquires, and prints "acquired K"
// for each; every other Claim must find the key in flight or completed.
func claimerProcess() int {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, os.Getenv("SQLITESTORE_TEST_FILE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer s.Close()
	var (
		mu     sync.Mutex
		failed error
		wg     sync.WaitGroup
		keys   = make(chan int)
	)
	for range 8 {
		wg.Go(func() {
			for k := range keys {
				id := engine.ID{Key: fmt.Sprint("k", k)}
				for {
					c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
					if err == nil && c.Status == engine.Acquired {
						err = s.Complete(ctx, id, c.Token, created(fmt.Sprint(os.Getpid())), time.Hour)
						mu.Lock()
						fmt.Println("acquired", k)
						mu.Unlock()
					}
					if err != nil {
						mu.Lock()
						failed = errors.Join(failed, err)
						mu.Unlock()
					}
					if err != nil || c.Status != engine.InFlight {
						break
					}
				}
			}
		})
	}
	for k := range 300 {
		keys <- k
	}
	close(keys)
	wg.Wait()
	if failed != nil {
		fmt.Fprintln(os.Stderr, failed)
		return 1
	}
	return 0
}

// Two processes claim the same 300 keys in one file at the same time:
// every key is acquired once, by one of them.
func TestTwoProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.db")
	open(t, path) // the table exists before the race
	var outs [2][]byte
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=1", "SQLITESTORE_TEST_FILE="+path)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			assert.NoError(t, err, "process %d: %s", i, stderr.String())
			outs[i] = out
		})
	}
	wg.Wait()
	acquired := map[string]int{}
	for _, out := range outs {
		for _, line := range strings.Fields(strings.ReplaceAll(string(out), "acquired ", "")) {
			acquired[line]++
		}
	}
	assert.Len(t, acquired, 300, "keys acquired")
	for k, n := range acquired {
		assert.Equal(t, 1, n, "key %s acquired %d times", k, n)
	}
	t.Logf("acquired by the first process: %d, by the second: %d", len(strings.Fields(string(outs[0])))/2, len(strings.Fields(string(outs[1])))/2)
}

// The sweeper never deletes a live record: whatever moves a record's expiry
// later (a Complete after the lease ended, an Extend, a Resolve) moves the
// time from which it may be swept (sweep_at) with it. A Complete within the
// lease leaves sweep_at, which is then at most a lease past the expiry.
func TestSweepAt(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	sqlitestore.FirstSwept(s)
	late, extended, resolved, early := engine.ID{Key: "late"}, engine.ID{Key: "extended"}, engine.ID{Key: "resolved"}, engine.ID{Key: "early"}
	lateTok := acquire(t, s, late, time.Millisecond)
	extendedTok := acquire(t, s, extended, time.Millisecond)
	acquire(t, s, resolved, time.Millisecond)
	require.NoError(t, s.Complete(ctx, early, acquire(t, s, early, time.Hour), created(`{}`), time.Minute))
	start := time.Now()
	require.Eventually(t, func() bool { return time.Since(start) > 2*time.Millisecond }, time.Second, time.Millisecond) // the leases end
	require.NoError(t, s.Complete(ctx, late, lateTok, created(`{}`), 3*time.Hour))
	require.NoError(t, s.Extend(ctx, extended, extendedTok, 3*time.Hour))
	require.NoError(t, s.Resolve(ctx, resolved, created(`{}`), 3*time.Hour))

	rows, err := s.DB().QueryContext(ctx, "SELECT key, expires_at, sweep_at FROM idempotency_records")
	require.NoError(t, err)
	defer rows.Close()
	got := map[string][2]int64{}
	for rows.Next() {
		var (
			key              []byte
			expires, sweepAt int64
		)
		require.NoError(t, rows.Scan(&key, &expires, &sweepAt))
		got[string(key)] = [2]int64{expires, sweepAt}
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 4)
	for key, g := range got {
		assert.LessOrEqual(t, g[0], g[1], "%s: expires_at after sweep_at", key)
	}
	hour := time.Hour.Microseconds()
	assert.Greater(t, got["early"][1]-got["early"][0], hour-time.Minute.Microseconds(), "early: sweep_at is the claim's expiry")
	for _, key := range []string{"late", "extended", "resolved"} {
		assert.Greater(t, got[key][1], time.Now().UnixMicro()+2*hour, "%s: sweep_at", key)
	}
	assert.Zero(t, sqlitestore.Sweep(ctx, s, 10), "records swept")
}
