package pgstore_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/steps"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/pgstore"
)

func doneStep(name string, result []byte) engine.Step {
	return engine.Step{Name: name, Fingerprint: "fp-" + name, Done: true, Result: result}
}

// A SaveStep that waits for the record's row, which another transaction
// changed and then commits, is judged on the row as that transaction left
// it, not as the statement's snapshot saw it: a takeover that commits
// meanwhile makes it lost, even at the limit of steps, where the snapshot
// would say the record is held and full.
func TestSaveStepWaitsForConcurrentChange(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)
	for _, tc := range []struct {
		name     string
		full     bool   // the record holds steps.MaxSteps steps
		change   string // what the other transaction does to the row
		want     error
		wantKept bool
	}{
		{"takeover", false, "token = nextval(" + quoteLiteral(table+"_token_seq") + ")", engine.ErrLeaseLost, false},
		{"takeover when full", true, "token = nextval(" + quoteLiteral(table+"_token_seq") + ")", engine.ErrLeaseLost, false},
		{"extend", false, "lease_until = lease_until + interval '1 second'", nil, true},
		{"extend when full", true, "lease_until = lease_until + interval '1 second'", engine.ErrNotStorable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := scopeID("race " + tc.name)
			tok := acquire(t, ctx, s, id, "fp")
			if tc.full {
				for i := range steps.MaxSteps {
					require.NoError(t, s.SaveStep(ctx, id, tok, doneStep(fmt.Sprintf("s%03d", i), []byte("x"))))
				}
			}
			other, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer rollbackQuietly(other)
			tag, err := other.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET "+tc.change+
				" WHERE scope = $1 AND key = $2", []byte(id.Scope), []byte(id.Key))
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())

			saved := make(chan error, 1)
			go func() { saved <- s.SaveStep(ctx, id, tok, doneStep("late", []byte("y"))) }()
			eventually(t, 10*time.Second, "SaveStep to wait for the row", func() bool {
				return count(t, ctx, pool, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, table) > 0
			})
			require.NoError(t, other.Commit(ctx))
			err = <-saved
			if tc.want == nil {
				assert.NoError(t, err, "SaveStep")
			} else {
				assert.ErrorIs(t, err, tc.want, "SaveStep")
			}
			rec, err := s.Lookup(ctx, id)
			require.NoError(t, err)
			kept := false
			for _, st := range rec.Steps {
				kept = kept || st.Name == "late"
			}
			assert.Equal(t, tc.wantKept, kept, "the step is recorded")
		})
	}
}

func quoteLiteral(s string) string { return "'" + s + "'" }

func rollbackQuietly(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx.Rollback(ctx)
}

var fullSteps = flag.Bool("pgstore.fullsteps", false,
	"make every step of TestStepsAtTheLimits as large as a step may be (6.4 MiB in one row; about 20 s)")

// A record of steps.MaxSteps steps, the first ten of steps.MaxSize
// bytes (all of them with -pgstore.fullsteps): a row's array of 650 KiB
// (6.4 MiB), which PostgreSQL keeps compressed out of line (TOAST), every
// byte of it kept. Each SaveStep rewrites the array: the test logs what the
// last large one takes.
func TestStepsAtTheLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := newPool(t)
	s, _ := newStore(t, pool)
	id := scopeID("limits")
	tok := acquire(t, ctx, s, id, "fp")
	large := 10
	if *fullSteps {
		large = steps.MaxSteps
	}
	start := time.Now()
	want := make([]engine.Step, steps.MaxSteps)
	var last time.Duration
	for i := range want {
		name := fmt.Sprintf("step-%03d", i)
		fp := "fp-" + name
		// Results that differ, the first ones the most a step holds.
		size := 3
		if i < large {
			size = steps.MaxSize - len(name) - len(fp)
		}
		result := bytes.Repeat([]byte{byte(i), 0, 0xff, byte(i >> 3)}, steps.MaxSize/4)[:size]
		want[i] = engine.Step{Name: name, Fingerprint: fp, Done: true, Result: result}
		began := time.Now()
		require.NoError(t, s.SaveStep(ctx, id, tok, want[i]))
		if i < large {
			last = time.Since(began)
		}
	}
	t.Logf("SaveStep of a step of %d bytes beside %d others as large: %v; the %d SaveSteps: %v",
		steps.MaxSize, large-1, last, steps.MaxSteps, time.Since(start))
	require.NoError(t, s.Release(ctx, id, tok))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	require.Len(t, c.Steps, steps.MaxSteps)
	for i, st := range c.Steps {
		if st.Name != want[i].Name || !bytes.Equal(st.Result, want[i].Result) || st.Fingerprint != want[i].Fingerprint || !st.Done {
			t.Errorf("step %d = %q (%d bytes), want %q (%d bytes)", i, st.Name, len(st.Result), want[i].Name, len(want[i].Result))
		}
	}
	require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
	rec, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Empty(t, rec.Steps, "steps after Complete")
}

// statementCounter counts the statements that a pool's connections send.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The statements, each one round trip, of each operation, which the
// package documentation states: steps cost a new key's first execution,
// and a replay, nothing. A new key's claim inserts first; the claims of
// keys with a record read first, as the Store does once they are a third
// of its claims (TestClaimPath has the switch).
func TestStatementsPerOperation(t *testing.T) {
	ctx := testContext(t)
	var counter statementCounter
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &counter })
	s, _ := newStore(t, pool)
	pgstore.ClaimInsertFirst(s)
	orders := newOrders(t, pool)
	statements := func(what string, want int64, op func()) {
		t.Helper()
		before := counter.n.Load()
		op()
		assert.Equal(t, want, counter.n.Load()-before, "statements of %s", what)
	}
	id := scopeID("counted")
	var c engine.Claim
	statements("the Claim of a new key", 1, func() {
		var err error
		c, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status)
	})
	pgstore.ClaimReadFirst(s)
	statements("a SaveStep", 1, func() { require.NoError(t, s.SaveStep(ctx, id, c.Token, doneStep("a", []byte("1")))) })
	statements("a Release", 1, func() { require.NoError(t, s.Release(ctx, id, c.Token)) })
	statements("the Claim after a release, with the steps", 2, func() {
		var err error
		c, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Len(t, c.Steps, 1)
	})
	statements("a Complete", 1, func() { require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour)) })
	statements("a replay", 1, func() {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Completed, c.Status)
	})

	pgstore.ClaimInsertFirst(s)
	r, err := once.New(s, once.WithConfig(engine.Config{Logger: quiet}))
	require.NoError(t, err)
	defer r.Shutdown(ctx)
	statements("a first execution through once.Do, with a RunStep of one INSERT", 2+4, func() {
		_, err := once.Do(ctx, r, scopeID("counted run"), "input", func(ctx context.Context) (int64, error) {
			return pgstore.RunStep(ctx, s, "order", 1, func(ctx context.Context, tx pgx.Tx) (int64, error) {
				return insertOrder(ctx, tx, orders, "counted")
			})
		})
		require.NoError(t, err)
	})
}
