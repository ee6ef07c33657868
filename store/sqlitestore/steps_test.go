package sqlitestore_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	stepLimits "github.com/idemkit/idempotency/internal/steps"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
	"github.com/idemkit/idempotency/store/sqlitestore"
)

// fullStep is a step of stepLimits.MaxSize bytes.
func fullStep(name string, fill byte) engine.Step {
	fp := "fp-" + name
	return engine.Step{Name: name, Fingerprint: fp, Done: true,
		Result: bytes.Repeat([]byte{fill}, stepLimits.MaxSize-len(name)-len(fp))}
}

// The most a record holds, stepLimits.MaxSteps steps of stepLimits.MaxSize
// bytes (6.5 MB in one row), is kept, returned by the next Claim and by
// Lookup, and replaced at the limit. The first steps are written into the
// row directly: each step rewrites the log whole, so that saving them all
// takes seconds (see the package documentation).
func TestStepsFullSize(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"))
	id := engine.ID{Key: "full"}
	tok := acquire(t, s, id, time.Minute)
	var first []engine.Step
	for i := range stepLimits.MaxSteps - 1 {
		first = append(first, fullStep(fmt.Sprintf("s%03d", i), byte(i)))
	}
	_, err := s.DB().Exec("UPDATE idempotency_records SET steps = ?, step_count = ? WHERE token = ?",
		sqlrecord.EncodeSteps(first), len(first), int64(tok))
	require.NoError(t, err)
	last := fullStep(fmt.Sprintf("s%03d", stepLimits.MaxSteps-1), 0xff)
	start := time.Now()
	require.NoError(t, s.SaveStep(ctx, id, tok, last), "step %d", stepLimits.MaxSteps)
	t.Logf("step %d of %d bytes saved in %v", stepLimits.MaxSteps, stepLimits.MaxSize, time.Since(start))
	assert.ErrorIs(t, s.SaveStep(ctx, id, tok, fullStep("one-too-many", 1)), engine.ErrNotStorable)
	require.NoError(t, s.SaveStep(ctx, id, tok, fullStep("s000", 0xee)), "a step replaced at the limit")
	var size int64
	require.NoError(t, s.DB().QueryRow("SELECT length(steps) FROM idempotency_records").Scan(&size))
	t.Logf("the row's steps take %d bytes", size)

	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Len(t, rec.Steps, stepLimits.MaxSteps, "Lookup")
	require.NoError(t, s.Release(ctx, id, tok))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Len(t, c.Steps, stepLimits.MaxSteps)
	got := map[string][]byte{}
	for _, st := range c.Steps {
		got[st.Name] = st.Result
	}
	want := append(first, last)
	want[0] = fullStep("s000", 0xee)
	for _, st := range want {
		assert.True(t, bytes.Equal(got[st.Name], st.Result), "step %s", st.Name)
	}
}

// In transactional mode a step is written in the lease's transaction,
// which holds the file's write lock: it does not wait for that lock, and
// is not seen outside the transaction; a Release rolls it back with the
// handler's writes, and Complete commits the record without it.
func TestStepsTransactional(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"), sqlitestore.WithTransactions())
	stepCount := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}, id engine.ID) (n int) {
		t.Helper()
		err := q.QueryRowContext(ctx, "SELECT step_count FROM idempotency_records WHERE key = ?", []byte(id.Key)).Scan(&n)
		if err == sql.ErrNoRows {
			return -1
		}
		require.NoError(t, err)
		return n
	}

	id := engine.ID{Key: "released"}
	tok := acquire(t, s, id, time.Minute)
	bound := s.Bind(ctx, id, tok)
	tx, ok := sqlitestore.TxFromContext(bound)
	require.True(t, ok)
	// Within a deadline shorter than the busy timeout: a write through
	// another connection would wait for the file's write lock.
	short, cancel := context.WithTimeout(bound, 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			assert.NoError(t, s.SaveStep(short, id, tok, engine.Step{Name: fmt.Sprint("s", i), Fingerprint: "fp", Done: true, Result: []byte{byte(i)}}))
		})
	}
	wg.Wait()
	require.NoError(t, s.SaveStep(context.Background(), id, tok, engine.Step{Name: "s0"}), "a removal, on a context without the transaction")
	assert.Equal(t, 7, stepCount(tx, id), "steps seen in the transaction")
	assert.Equal(t, -1, stepCount(s.DB(), id), "the record seen outside the transaction")
	require.NoError(t, s.Release(ctx, id, tok))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	assert.Empty(t, c.Steps, "steps after a Release")
	assert.Zero(t, c.Abandoned)
	assert.ErrorIs(t, s.SaveStep(ctx, id, c.Token-1, engine.Step{Name: "x", Fingerprint: "fp"}), engine.ErrLeaseLost, "a token without a transaction")
	require.NoError(t, s.SaveStep(s.Bind(ctx, id, c.Token), id, c.Token, engine.Step{Name: "a", Fingerprint: "fp"}))
	require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.True(t, rec.Completed)
	assert.Empty(t, rec.Steps)
	assert.Zero(t, stepCount(s.DB(), id), "step_count after Complete")
	assert.ErrorIs(t, s.SaveStep(ctx, id, c.Token, engine.Step{Name: "b", Fingerprint: "fp"}), engine.ErrLeaseLost, "SaveStep after Complete")
}

// oldSchema is the table as versions before steps made it.
const oldSchema = `CREATE TABLE idempotency_records (token INTEGER PRIMARY KEY, scope BLOB NOT NULL, key BLOB NOT NULL,
	fingerprint BLOB NOT NULL, completed INTEGER NOT NULL DEFAULT 0, abandoned INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL, lease_until INTEGER NOT NULL, expires_at INTEGER NOT NULL, sweep_at INTEGER NOT NULL,
	status INTEGER, headers BLOB, body BLOB, body_omitted INTEGER NOT NULL DEFAULT 0, UNIQUE (scope, key));
CREATE INDEX idempotency_records_sweep_at ON idempotency_records (sweep_at)`

// Open adds the columns of steps to a file made before them, when several
// stores (each with connections of its own, as processes have) open it at
// once, and keeps its records: a completed one replays, and one whose
// holder was lost is taken over, without steps, and then keeps steps.
func TestMigrateSteps(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "records.db")
	old, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)") // as every version opens it
	require.NoError(t, err)
	_, err = old.Exec(oldSchema)
	require.NoError(t, err)
	now := time.Now().UnixMicro()
	hour := time.Hour.Microseconds()
	_, err = old.Exec(`INSERT INTO idempotency_records (scope, key, fingerprint, completed, created_at, lease_until, expires_at, sweep_at, status, body)
		VALUES (x'', CAST('done' AS BLOB), CAST('fp' AS BLOB), 1, ?1, ?1, ?2, ?2, 201, x''),
		       (x'', CAST('lost' AS BLOB), CAST('fp' AS BLOB), 0, ?1, ?3, ?2, ?2, NULL, NULL)`, now, now+hour, now-1000)
	require.NoError(t, err)
	require.NoError(t, old.Close())

	stores := make([]sqlitestore.Store, 4)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() {
			s, err := sqlitestore.Open(ctx, path)
			if assert.NoError(t, err, "Open at once") {
				stores[i] = s
			}
		})
	}
	wg.Wait()
	for _, s := range stores {
		if s != nil {
			t.Cleanup(func() { s.Close() })
		}
	}
	require.NotContains(t, stores, nil)
	s := stores[0]
	c, err := s.Claim(ctx, engine.ID{Key: "done"}, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
	lost := engine.ID{Key: "lost"}
	c, err = s.Claim(ctx, lost, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	assert.Equal(t, 1, c.Abandoned)
	assert.Empty(t, c.Steps)
	require.NoError(t, s.SaveStep(ctx, lost, c.Token, engine.Step{Name: "a", Fingerprint: "fp", Done: true, Result: []byte("1")}))
	require.NoError(t, s.Release(ctx, lost, c.Token))
	c, err = stores[1].Claim(ctx, lost, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	assert.Equal(t, 1, c.Abandoned)
	require.Len(t, c.Steps, 1)
	assert.Equal(t, "1", string(c.Steps[0].Result))
}
