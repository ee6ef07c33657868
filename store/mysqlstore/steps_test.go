package mysqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	stepLimits "github.com/idemkit/idempotency/internal/steps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/store/mysqlstore"
)

// fullStep is a step of stepLimits.MaxSize bytes.
func fullStep(name string, fill byte) engine.Step {
	fp := "fp-" + name
	return engine.Step{Name: name, Fingerprint: fp, Done: true,
		Result: bytes.Repeat([]byte{fill}, stepLimits.MaxSize-len(name)-len(fp))}
}

func acquire(t *testing.T, s engine.Store, id engine.ID) engine.Claim {
	t.Helper()
	c, err := s.Claim(context.Background(), id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status, "Claim(%v)", id)
	return c
}

// stepsByName indexes steps by name.
func stepsByName(steps []engine.Step) map[string]engine.Step {
	m := make(map[string]engine.Step, len(steps))
	for _, st := range steps {
		m[st.Name] = st
	}
	return m
}

// The most a record holds, stepLimits.MaxSteps steps of stepLimits.MaxSize
// bytes (6.5 MB in one row), fits the server's max_allowed_packet (16 MiB
// on MariaDB by default): every step is kept, returned by the next Claim
// and by Lookup, and replaced at the limit.
func TestStepsFullSize(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	var maxPacket int64
	require.NoError(t, db.QueryRow("SELECT @@max_allowed_packet").Scan(&maxPacket))
	t.Logf("max_allowed_packet = %d", maxPacket)
	table := teststores.UniqueName(t, "mysqlstore_t_")
	s := teststores.MySQLOn(t, db, table)
	id := engine.ID{Key: "full"}
	c := acquire(t, s, id)
	start := time.Now()
	for i := range stepLimits.MaxSteps {
		require.NoError(t, s.SaveStep(ctx, id, c.Token, fullStep(fmt.Sprintf("s%03d", i), byte(i))), "step %d", i)
	}
	t.Logf("%d steps of %d bytes saved in %v", stepLimits.MaxSteps, stepLimits.MaxSize, time.Since(start))
	assert.ErrorIs(t, s.SaveStep(ctx, id, c.Token, fullStep("one-too-many", 1)), engine.ErrNotStorable)
	require.NoError(t, s.SaveStep(ctx, id, c.Token, fullStep("s000", 0xee)), "a step replaced at the limit")
	var size int64
	require.NoError(t, db.QueryRow("SELECT LENGTH(steps) FROM `"+table+"`").Scan(&size))
	t.Logf("the row's steps take %d bytes", size)

	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Len(t, rec.Steps, stepLimits.MaxSteps, "Lookup")
	require.NoError(t, s.Release(ctx, id, c.Token))
	c = acquire(t, s, id)
	require.Len(t, c.Steps, stepLimits.MaxSteps)
	got := stepsByName(c.Steps)
	for i := range stepLimits.MaxSteps {
		want := fullStep(fmt.Sprintf("s%03d", i), byte(i))
		if i == 0 {
			want = fullStep("s000", 0xee)
		}
		assert.True(t, bytes.Equal(got[want.Name].Result, want.Result), "step %s", want.Name)
	}
}

// On a server whose max_allowed_packet is smaller than a record's steps
// may grow (1 MiB here), a step that would take the record's steps past it
// is refused with engine.ErrNotStorable, and the steps kept before stay
// whole: CONCAT past max_allowed_packet would be NULL (with a warning only,
// outside strict mode, which this server runs without). A step replaced
// there still fits, once the log is compacted.
func TestStepsMaxAllowedPacket(t *testing.T) {
	ctx := context.Background()
	db := startMariaDB(t, "--max-allowed-packet=1M", "--sql-mode=")
	table := "records"
	s, err := mysqlstore.New(db, mysqlstore.WithTable(table))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.NoError(t, s.Migrate(ctx))
	id := engine.ID{Key: "k"}
	c := acquire(t, s, id)
	saved := 0
	for ; saved < stepLimits.MaxSteps; saved++ {
		err := s.SaveStep(ctx, id, c.Token, fullStep(fmt.Sprintf("s%03d", saved), byte(saved)))
		if err != nil {
			require.ErrorIs(t, err, engine.ErrNotStorable, "step %d", saved)
			t.Logf("step %d refused: %v", saved, err)
			break
		}
	}
	require.Less(t, saved, stepLimits.MaxSteps, "every step fitted 1 MiB")
	require.Greater(t, saved, 5, "steps saved before the refusal")
	var size int64
	require.NoError(t, db.QueryRow("SELECT COALESCE(LENGTH(steps), 0) FROM "+table).Scan(&size))
	assert.LessOrEqual(t, size, int64(1<<20), "the row's steps")
	t.Logf("%d steps of %d bytes saved, taking %d bytes", saved, stepLimits.MaxSize, size)
	require.NoError(t, s.SaveStep(ctx, id, c.Token, fullStep("s000", 0xee)), "a step replaced")
	require.NoError(t, s.SaveStep(ctx, id, c.Token, fullStep("s001", 0xdd)), "a step replaced")

	require.NoError(t, s.Release(ctx, id, c.Token))
	c = acquire(t, s, id)
	require.Len(t, c.Steps, saved)
	got := stepsByName(c.Steps)
	assert.True(t, bytes.Equal(got["s000"].Result, fullStep("s000", 0xee).Result))
	assert.True(t, bytes.Equal(got["s001"].Result, fullStep("s001", 0xdd).Result))
	last := fullStep(fmt.Sprintf("s%03d", saved-1), byte(saved-1))
	assert.True(t, bytes.Equal(got[last.Name].Result, last.Result))
}

// In transactional mode a step is written in the lease's transaction, which
// holds the record's row lock: it neither waits for that lock nor is seen
// outside the transaction; a Release rolls it back with the handler's
// writes, and Complete commits the record without it. Steps saved at once
// do not interleave on the transaction's connection.
func TestStepsTransactional(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	table := teststores.UniqueName(t, "mysqlstore_t_")
	s := teststores.MySQLOn(t, db, table, mysqlstore.WithTransactions())
	stepCount := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}, id engine.ID) (n int) {
		t.Helper()
		err := q.QueryRowContext(ctx, "SELECT step_count FROM `"+table+"` WHERE `key` = ?", []byte(id.Key)).Scan(&n)
		if err == sql.ErrNoRows {
			return -1
		}
		require.NoError(t, err)
		return n
	}

	id := engine.ID{Key: "released"}
	c := acquire(t, s, id)
	bound := s.Bind(ctx, id, c.Token)
	tx, ok := mysqlstore.TxFromContext(bound)
	require.True(t, ok)
	// Within a deadline shorter than the server's lock wait: a write
	// through another connection would wait for the row lock and fail.
	short, cancel := context.WithTimeout(bound, 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			assert.NoError(t, s.SaveStep(short, id, c.Token, engine.Step{Name: fmt.Sprint("s", i), Fingerprint: "fp", Done: true, Result: []byte{byte(i)}}))
		})
	}
	wg.Wait()
	require.NoError(t, s.SaveStep(context.Background(), id, c.Token, engine.Step{Name: "s0"}), "a removal, on a context without the transaction")
	assert.Equal(t, 7, stepCount(tx, id), "steps seen in the transaction")
	assert.Equal(t, -1, stepCount(db, id), "the record seen outside the transaction")
	require.NoError(t, s.Release(ctx, id, c.Token))
	c = acquire(t, s, id)
	assert.Empty(t, c.Steps, "steps after a Release")
	assert.Zero(t, c.Abandoned)
	assert.ErrorIs(t, s.SaveStep(ctx, id, c.Token-1, engine.Step{Name: "x", Fingerprint: "fp"}), engine.ErrLeaseLost, "a token without a transaction")
	require.NoError(t, s.SaveStep(s.Bind(ctx, id, c.Token), id, c.Token, engine.Step{Name: "a", Fingerprint: "fp"}))
	require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.True(t, rec.Completed)
	assert.Empty(t, rec.Steps)
	assert.Zero(t, stepCount(db, id), "step_count after Complete")
	assert.ErrorIs(t, s.SaveStep(ctx, id, c.Token, engine.Step{Name: "b", Fingerprint: "fp"}), engine.ErrLeaseLost, "SaveStep after Complete")
}

// What a step costs, counted by the server on the one connection of the
// database: one statement that updates one row; a Claim that takes over a
// record with steps is the read and the claim, as without steps; the
// compaction at the limit is a transaction of a locking read and an update.
func TestStepStatements(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	db.SetMaxOpenConns(1)
	s := teststores.MySQLOn(t, db, teststores.UniqueName(t, "mysqlstore_t_"))
	counters := []string{"Com_stmt_execute", "Com_begin", "Com_commit", "Handler_update", "Handler_write"}
	status := func() map[string]int64 {
		m := map[string]int64{}
		rows, err := db.QueryContext(ctx, "SHOW SESSION STATUS WHERE Variable_name IN ('"+strings.Join(counters, "', '")+"')")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var (
				k string
				v int64
			)
			require.NoError(t, rows.Scan(&k, &v))
			m[k] = v
		}
		require.NoError(t, rows.Err())
		require.Len(t, m, len(counters))
		return m
	}
	delta := func(f func()) map[string]int64 {
		before := status()
		f()
		after := status()
		for k := range after {
			after[k] -= before[k]
		}
		return after
	}
	warm := engine.ID{Key: "warm"}
	c := acquire(t, s, warm)
	require.NoError(t, s.SaveStep(ctx, warm, c.Token, engine.Step{Name: "a", Fingerprint: "fp"})) // prepares
	require.NoError(t, s.Release(ctx, warm, c.Token))
	acquire(t, s, warm)

	id := engine.ID{Key: "k"}
	c = acquire(t, s, id)
	assert.Equal(t, map[string]int64{"Com_stmt_execute": 1, "Com_begin": 0, "Com_commit": 0, "Handler_update": 1, "Handler_write": 0},
		delta(func() {
			require.NoError(t, s.SaveStep(ctx, id, c.Token, engine.Step{Name: "a", Fingerprint: "fp", Done: true, Result: []byte("1")}))
		}), "a step")
	require.NoError(t, s.Release(ctx, id, c.Token))
	// Handler_write counts the INSERT's attempt, which finds the key.
	assert.Equal(t, map[string]int64{"Com_stmt_execute": 2, "Com_begin": 0, "Com_commit": 0, "Handler_update": 1, "Handler_write": 1},
		delta(func() {
			c = acquire(t, s, id)
			require.Len(t, c.Steps, 1)
		}), "a Claim that takes over a record with steps")
	for i := 1; i < stepLimits.MaxSteps; i++ {
		require.NoError(t, s.SaveStep(ctx, id, c.Token, engine.Step{Name: "a", Fingerprint: "fp", Done: true, Result: []byte{byte(i)}}))
	}
	assert.Equal(t, map[string]int64{"Com_stmt_execute": 3, "Com_begin": 1, "Com_commit": 1, "Handler_update": 1, "Handler_write": 0},
		delta(func() {
			require.NoError(t, s.SaveStep(ctx, id, c.Token, engine.Step{Name: "a", Fingerprint: "fp", Done: true, Result: []byte("last")}))
		}), "the step past stepLimits.MaxSteps entries, which compacts them")
	require.NoError(t, s.Release(ctx, id, c.Token))
	c = acquire(t, s, id)
	require.Len(t, c.Steps, 1)
	assert.Equal(t, "last", string(c.Steps[0].Result))
}

// oldSchema is the table as versions before steps made it.
const oldSchema = "CREATE TABLE `%s` (scope VARBINARY(1024) NOT NULL, `key` VARBINARY(1024) NOT NULL, fingerprint BLOB NOT NULL," +
	" completed BOOLEAN NOT NULL DEFAULT FALSE, token BIGINT NOT NULL, version BIGINT NOT NULL DEFAULT 0, abandoned INT NOT NULL DEFAULT 0," +
	" created_at BIGINT NOT NULL, lease_until BIGINT NOT NULL, expires_at BIGINT NOT NULL, status INT NULL, headers LONGBLOB NULL," +
	" body LONGBLOB NULL, body_omitted BOOLEAN NOT NULL DEFAULT FALSE, PRIMARY KEY (scope, `key`), KEY expires_at (expires_at)) ENGINE=InnoDB"

// Migrate adds the columns of steps to a table made before them, when
// several instances run it at once, and keeps its records: a completed one
// replays, and one whose holder was lost is taken over, without steps, and
// then keeps steps.
func TestMigrateSteps(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	table := teststores.UniqueName(t, "mysqlstore_t_")
	_, err := db.Exec(fmt.Sprintf(oldSchema, table))
	require.NoError(t, err)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	now := time.Now().UnixMicro()
	_, err = db.Exec("INSERT INTO `"+table+"` (scope, `key`, fingerprint, completed, token, created_at, lease_until, expires_at, status, body)"+
		" VALUES ('', 'done', 'fp', TRUE, 1, ?, ?, ?, 201, '{}'), ('', 'lost', 'fp', FALSE, 2, ?, ?, ?, NULL, NULL)",
		now, now, now+time.Hour.Microseconds(), now, now-time.Second.Microseconds(), now+time.Hour.Microseconds())
	require.NoError(t, err)

	stores := make([]mysqlstore.Store, 4)
	for i := range stores {
		stores[i], err = mysqlstore.New(db, mysqlstore.WithTable(table))
		require.NoError(t, err)
		t.Cleanup(func() { stores[i].Close() })
	}
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() { assert.NoError(t, s.Migrate(ctx), "Migrate at once") })
	}
	wg.Wait()
	s := stores[0]
	require.NoError(t, s.Migrate(ctx), "Migrate again")

	c, err := s.Claim(ctx, engine.ID{Key: "done"}, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
	lost := engine.ID{Key: "lost"}
	c = acquire(t, s, lost)
	assert.Equal(t, 1, c.Abandoned)
	assert.Empty(t, c.Steps)
	require.NoError(t, s.SaveStep(ctx, lost, c.Token, engine.Step{Name: "a", Fingerprint: "fp", Done: true, Result: []byte("1")}))
	require.NoError(t, s.Release(ctx, lost, c.Token))
	c = acquire(t, stores[1], lost)
	assert.Equal(t, 1, c.Abandoned)
	require.Len(t, c.Steps, 1)
	assert.Equal(t, "1", string(c.Steps[0].Result))
}
