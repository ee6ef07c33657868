package mysqlstore_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/store/mysqlstore"
	"github.com/idemkit/idempotency/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite, with the driver counting changed rows (the default) and with
// clientFoundRows, which counts matched ones.
func TestConformance(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		t.Run(fmt.Sprint("clientFoundRows=", foundRows), func(t *testing.T) {
			s := teststores.MySQLOn(t, teststores.MySQLDB(t, foundRows), teststores.UniqueName(t, "mysqlstore_t_"))
			storetest.Run(t, func(t *testing.T) engine.Store { return s })
		})
	}
}

func created(body string) *engine.Response {
	return &engine.Response{Status: http.StatusCreated, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

// The claim statement's outcome, as the server reports it: the insert ID
// (LAST_INSERT_ID) is the token, or 0 when nothing changed, and the
// affected rows are 1 for an insert, 2 for a takeover and, for an unchanged
// row, 0, or 1 with clientFoundRows. Claim reads the insert ID first, so
// both settings give the same answers.
func TestClaimOutcome(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		t.Run(fmt.Sprint("clientFoundRows=", foundRows), func(t *testing.T) {
			ctx := context.Background()
			db := teststores.MySQLDB(t, foundRows)
			table := teststores.UniqueName(t, "mysqlstore_t_")
			teststores.MySQLOn(t, db, table)
			q, args := mysqlstore.ClaimStatement(table)
			claim := func(version int64, lease time.Duration) (id, n int64) {
				res, err := db.ExecContext(ctx, q, args([]byte("s"), []byte("k"), []byte("fp"), lease.Microseconds(), (lease+time.Hour).Microseconds(), version)...)
				require.NoError(t, err)
				id, err = res.LastInsertId()
				require.NoError(t, err)
				n, err = res.RowsAffected()
				require.NoError(t, err)
				return id, n
			}
			tok, n := claim(-1, time.Millisecond)
			assert.Positive(t, tok, "insert ID of an insert")
			assert.EqualValues(t, 1, n, "rows affected by an insert")

			unchangedRows := int64(0)
			if foundRows {
				unchangedRows = 1
			}
			id, n := claim(7, time.Minute) // not the version of the row
			assert.Zero(t, id, "insert ID of an unchanged row")
			assert.Equal(t, unchangedRows, n, "rows affected, unchanged")

			time.Sleep(2 * time.Millisecond) // the 1 ms lease passes: a wait for the server's clock, not a condition
			id, n = claim(0, time.Minute)    // the row's version
			assert.Greater(t, id, tok, "insert ID of a takeover: the new token")
			assert.EqualValues(t, 2, n, "rows affected by a takeover")

			id, n = claim(0, time.Minute) // the version before the takeover
			assert.Zero(t, id)
			assert.Equal(t, unchangedRows, n, "rows affected, unchanged")
		})
	}
}

func TestNewRejects(t *testing.T) {
	db := teststores.MySQLDB(t, false)
	for _, name := range []string{"", "a`b", "t; DROP TABLE x", "1t", "a.b.c", ".t", strings.Repeat("t", 65), "tablé"} {
		s, err := mysqlstore.New(db, mysqlstore.WithTable(name))
		if err == nil {
			s.Close()
			t.Fatalf("New(WithTable(%q)) error = nil", name)
		}
		assert.True(t, strings.HasPrefix(err.Error(), "mysqlstore: "), "error %q lacks the package prefix", err)
	}
	_, err := mysqlstore.New(nil)
	assert.Error(t, err)
}

func TestSweep(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	table := teststores.UniqueName(t, "mysqlstore_t_")
	s := teststores.MySQLOn(t, db, table)
	for i := range 25 {
		id := engine.ID{Key: fmt.Sprint("short-", i)}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Millisecond)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Millisecond))
	}
	keep := engine.ID{Key: "kept"}
	c, err := s.Claim(ctx, keep, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, keep, c.Token, created(`{}`), time.Hour))
	var swept int64
	// The sweep leaves a record a second past its expiry.
	require.Eventually(t, func() bool {
		swept += mysqlstore.Sweep(ctx, s, 10)
		return swept == 25
	}, 10*time.Second, 20*time.Millisecond)
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM `"+table+"`").Scan(&n))
	assert.Equal(t, 1, n, "records left")
}

// Released, forgotten or swept, a key's next token is larger.
func TestTokensAfterRelease(t *testing.T) {
	ctx := context.Background()
	s := teststores.MySQL(t)
	id := engine.ID{Key: "k"}
	last := engine.Token(0)
	for i := range 3 {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status)
		require.Greater(t, c.Token, last, "token %d", i)
		last = c.Token
		if i%2 == 0 {
			require.NoError(t, s.Release(ctx, id, c.Token))
		} else {
			require.NoError(t, s.Resolve(ctx, id, nil, 0))
		}
	}
}

// What each operation sends, counted by the server on the one connection
// of the database: a first execution is three statements (the read, the
// claim and the Complete), two of which write a row, and a replay is one
// read, which writes none; once prepared, no statement is prepared again.
func TestStatements(t *testing.T) {
	ctx := context.Background()
	db := teststores.MySQLDB(t, false)
	db.SetMaxOpenConns(1)
	s := teststores.MySQLOn(t, db, teststores.UniqueName(t, "mysqlstore_t_"))
	counters := []string{"Com_stmt_prepare", "Com_stmt_execute", "Handler_write", "Handler_update", "Handler_delete"}
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
	first := func(id engine.ID) {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, c.Status)
		require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
	}
	first(engine.ID{Key: "warm"}) // prepares the statements
	assert.Equal(t, map[string]int64{"Com_stmt_prepare": 0, "Com_stmt_execute": 3, "Handler_write": 1, "Handler_update": 1, "Handler_delete": 0},
		delta(func() { first(engine.ID{Key: "new"}) }), "first execution")
	assert.Equal(t, map[string]int64{"Com_stmt_prepare": 0, "Com_stmt_execute": 1, "Handler_write": 0, "Handler_update": 0, "Handler_delete": 0},
		delta(func() {
			c, err := s.Claim(ctx, engine.ID{Key: "new"}, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Completed, c.Status)
		}), "replay")
}

// After Close, Claim is refused, and a request that claimed before it
// still records its steps and completes, with the statements sent
// unprepared.
func TestClose(t *testing.T) {
	ctx := context.Background()
	s := teststores.MySQL(t)
	done, extended, released := engine.ID{Key: "done"}, engine.ID{Key: "extended"}, engine.ID{Key: "released"}
	tokens := map[engine.ID]engine.Token{}
	for _, id := range []engine.ID{done, extended, released} {
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		tokens[id] = c.Token
	}
	require.NoError(t, s.Close())
	_, err := s.Claim(ctx, engine.ID{Key: "late"}, "fp", time.Minute, time.Hour)
	require.ErrorIs(t, err, engine.ErrStoreClosed)
	require.NoError(t, s.Extend(ctx, extended, tokens[extended], time.Minute))
	require.NoError(t, s.SaveStep(ctx, extended, tokens[extended], engine.Step{Name: "a", Fingerprint: "fp"}))
	require.NoError(t, s.SaveStep(ctx, extended, tokens[extended], engine.Step{Name: "b", Fingerprint: "fp"}))
	require.NoError(t, s.SaveStep(ctx, extended, tokens[extended], engine.Step{Name: "a"}), "a removal, in a transaction")
	rec, err := s.Lookup(ctx, extended)
	require.NoError(t, err)
	require.Len(t, rec.Steps, 1)
	assert.Equal(t, "b", rec.Steps[0].Name)
	require.NoError(t, s.Release(ctx, released, tokens[released]))
	require.NoError(t, s.Complete(ctx, done, tokens[done], created(`{"id":1}`), time.Hour))
	require.ErrorIs(t, s.Complete(ctx, done, tokens[done], created(`{"id":1}`), time.Hour), engine.ErrLeaseLost)
	rec, err = s.Lookup(ctx, done)
	require.NoError(t, err)
	assert.Equal(t, `{"id":1}`, string(rec.Response.Body))
}
