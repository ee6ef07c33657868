package pgstore_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
)

var pgbouncerBin = flag.String("pgstore.pgbouncer", "",
	"path of a pgbouncer binary: run the tests through a private PgBouncer in transaction mode")

// startPgBouncer runs a private PgBouncer in transaction mode in front of
// the test database, with two server connections for many clients, until t
// ends, and returns its port.
func startPgBouncer(t *testing.T) int {
	t.Helper()
	if *pgbouncerBin == "" {
		t.Skip("no -pgstore.pgbouncer: see README.md, Operating it")
	}
	cfg := poolConfig(t).ConnConfig
	dir, err := os.MkdirTemp("", "pgstore-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o777)) // for the user PgBouncer runs as
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d user=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
`, cfg.Host, cfg.Port, cfg.User, port, filepath.Join(dir, "users.txt"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(cfg.User)+` ""`+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "nobody"}, args...) // it refuses to run as root
	}
	cmd := exec.Command(*pgbouncerBin, args...)
	var log bytes.Buffer
	cmd.Stderr = &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("PgBouncer's log:\n%s", log.String())
		}
	})
	eventually(t, 10*time.Second, "PgBouncer to listen", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return port
}

// PgBouncer in transaction mode hands each transaction, and each statement
// outside one, to any of its server connections. pgx's default mode
// prepares statements by name on the connection it sees, which PgBouncer
// does not follow: the Store's own statements must not depend on it.
func TestThroughPgBouncer(t *testing.T) {
	port := startPgBouncer(t)
	direct := newPool(t)
	for _, transactional := range []bool{false, true} {
		t.Run(fmt.Sprintf("transactional=%v", transactional), func(t *testing.T) {
			ctx := testContext(t)
			_, table := newStore(t, direct)
			var logged countingHandler
			opts := []pgstore.Option{pgstore.WithTable(table), pgstore.WithLogger(slog.New(&logged))}
			if transactional {
				opts = append(opts, pgstore.WithTransactions())
			}
			pool := newPool(t, maxConns(8), func(c *pgxpool.Config) {
				c.ConnConfig.Port = uint16(port)
				c.ConnConfig.Host = "127.0.0.1"
			})
			s, err := pgstore.New(pool, opts...)
			require.NoError(t, err)
			defer s.Close()

			const workers, rounds = 8, 40
			errs := make(chan error, workers*rounds*3)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for r := range rounds {
						id := scopeID(fmt.Sprintf("bouncer %d %d", w, r))
						c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
						if err != nil {
							errs <- err
							continue
						}
						if err := s.Complete(ctx, id, c.Token, created(`{}`), time.Hour); err != nil {
							errs <- err
							continue
						}
						replay, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
						if err == nil && replay.Status != engine.Completed {
							err = fmt.Errorf("replay %v", replay.Status)
						}
						if err != nil {
							errs <- err
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			var failed []error
			for err := range errs {
				failed = append(failed, err)
			}
			if len(failed) > 0 {
				t.Errorf("%d of %d operations failed; the first: %v", len(failed), workers*rounds*3, failed[0])
			}
			if transactional {
				// Extend finds the transaction's backend through the
				// pooler, whose connections report process IDs of its
				// own.
				id := scopeID("bouncer extend")
				c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
				require.NoError(t, err)
				require.Equal(t, engine.Acquired, c.Status)
				bound := s.Bind(ctx, id, c.Token)
				assert.NoError(t, s.Extend(ctx, id, c.Token, time.Minute), "Extend of an open transaction")
				assert.NoError(t, bound.Err(), "the bound context of an open transaction")
				require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
			}
			if n := logged.n.Load(); n > 1 {
				t.Errorf("the switch to unnamed statements was logged %d times, want once at most", n)
			}
		})
	}
}

// countingHandler counts the records logged at warn level or above.
type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
