package pgstore_test

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
)

// Leases and times to live at their extremes, in both modes: no interval
// arithmetic overflows, a lease of math.MaxInt64 keeps a duplicate out for
// centuries, and a nanosecond ends at once.
func TestExtremeDurations(t *testing.T) {
	const forever = time.Duration(math.MaxInt64)
	pool := newPool(t)
	for _, mode := range []struct {
		name string
		opts []pgstore.Option
		// completeExpired is Complete's error for a record whose time to
		// live has passed: lease mode refuses it, transactional mode's row
		// lock still holds it.
		completeExpired error
	}{
		{"lease mode", nil, engine.ErrLeaseLost},
		{"transactional mode", []pgstore.Option{pgstore.WithTransactions(), pgstore.WithLockTimeout(20 * time.Millisecond)}, nil},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := testContext(t)
			s, _ := newStore(t, pool, mode.opts...)

			id := scopeID("forever")
			c, err := s.Claim(ctx, id, "fp", forever, forever)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
			dup, err := s.Claim(ctx, id, "fp", forever, forever)
			require.NoError(t, err)
			assert.Equal(t, engine.InFlight, dup.Status, "a duplicate of a lease of MaxInt64")
			assert.Positive(t, dup.RetryAfter)
			require.NoError(t, s.Extend(ctx, id, c.Token, forever))
			require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), forever))
			replay, err := s.Claim(ctx, id, "fp", forever, forever)
			require.NoError(t, err)
			assert.Equal(t, engine.Completed, replay.Status)
			rec, err := s.Lookup(ctx, id)
			require.NoError(t, err)
			assert.Greater(t, rec.Expires.Sub(rec.Created), 290*365*24*time.Hour)

			// A record that lives a nanosecond is gone by the next statement.
			id = scopeID("a nanosecond")
			c, err = s.Claim(ctx, id, "fp", time.Nanosecond, time.Nanosecond)
			require.NoError(t, err)
			require.Equal(t, engine.Acquired, c.Status)
			err = s.Complete(ctx, id, c.Token, created(`{}`), time.Nanosecond)
			if mode.completeExpired != nil {
				require.ErrorIs(t, err, mode.completeExpired)
			} else {
				require.NoError(t, err)
			}
			c, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, engine.Acquired, c.Status, "after a time to live of a nanosecond")
			require.NoError(t, s.Release(ctx, id, c.Token))
		})
	}
}

// In lease mode, a duplicate of a lease of math.MaxInt64 is told to retry
// after as long as a Duration holds, not after a microsecond.
func TestRetryAfterOfLongestLease(t *testing.T) {
	ctx := testContext(t)
	s, _ := newStore(t, newPool(t))
	id := scopeID("retry-after")
	_, err := s.Claim(ctx, id, "fp", math.MaxInt64, math.MaxInt64)
	require.NoError(t, err)
	dup, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.InFlight, dup.Status)
	assert.Greater(t, dup.RetryAfter, 290*365*24*time.Hour)
}

// Transactional mode: a handler that runs longer than the record's time to
// live (and its lease) still commits, since the transaction's row lock
// keeps everyone else off the record meanwhile.
func TestTxHandlerOutlivesRecord(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	orders := newOrders(t, pool)
	s, _ := newStore(t, pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(20*time.Millisecond))
	id := scopeID("slow handler")
	c, err := s.Claim(ctx, id, "fp", 10*time.Millisecond, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	hctx := s.Bind(ctx, id, c.Token)
	require.NoError(t, placeOrder(hctx, orders, id.Key, 1))
	tx, _ := pgstore.TxFromContext(hctx)
	var start time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT statement_timestamp()").Scan(&start))
	eventually(t, 5*time.Second, "the record's time to live to pass", func() bool {
		var now time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now))
		return now.Sub(start) > 50*time.Millisecond
	})
	dup, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.InFlight, dup.Status, "a duplicate while the handler runs on")

	require.NoError(t, s.Complete(ctx, id, c.Token, created(`{}`), time.Hour))
	assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key))
	replay, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, replay.Status)
}

// tooLarge returns a response over what a record holds. Its body is never
// written to, so that it costs address space, not memory: make it once per
// test.
func tooLarge() *engine.Response {
	return &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/octet-stream"}},
		Body:   make([]byte, 1<<30),
	}
}

func TestCompleteNotStorable(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	s, table := newStore(t, pool)

	// Over the size a record holds: refused before anything is sent.
	id := scopeID("too large")
	tok := acquire(t, ctx, s, id, "fp")
	large := tooLarge()
	err := s.Complete(ctx, id, tok, large, time.Hour)
	require.ErrorIs(t, err, engine.ErrNotStorable)
	assert.ErrorIs(t, s.Resolve(ctx, id, large, time.Hour), engine.ErrNotStorable)
	omitted := &engine.Response{Status: http.StatusCreated, Header: large.Header, BodyOmitted: true}
	require.NoError(t, s.Complete(ctx, id, tok, omitted, time.Hour), "the middleware's second try")
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
	assert.True(t, c.Response.BodyOmitted)

	id = scopeID("bad status")
	tok = acquire(t, ctx, s, id, "fp")
	assert.ErrorIs(t, s.Complete(ctx, id, tok, &engine.Response{Status: math.MaxInt32 + 1}, time.Hour), engine.ErrNotStorable)

	// What PostgreSQL refuses for one of its limits (program_limit_exceeded,
	// raised here by a trigger for any body), and a value it cannot take
	// (data_exception): another try cannot change either.
	_, err = pool.Exec(ctx, `CREATE FUNCTION `+pgx.Identifier{table + "_refuse"}.Sanitize()+`() RETURNS trigger
		LANGUAGE plpgsql AS $$ BEGIN
			IF length(NEW.body) > 0 AND convert_from(NEW.body, 'UTF8') = 'limit' THEN
				RAISE EXCEPTION 'too big' USING ERRCODE = 'program_limit_exceeded';
			END IF;
			IF length(NEW.body) > 0 AND convert_from(NEW.body, 'UTF8') = 'transient' THEN
				RAISE EXCEPTION 'try again' USING ERRCODE = 'serialization_failure';
			END IF;
			IF length(NEW.body) > 0 THEN PERFORM convert_from(NEW.body, 'UTF8'); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse BEFORE UPDATE ON `+pgx.Identifier{table}.Sanitize()+`
			FOR EACH ROW EXECUTE FUNCTION `+pgx.Identifier{table + "_refuse"}.Sanitize()+`()`)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, "DROP FUNCTION IF EXISTS "+pgx.Identifier{table + "_refuse"}.Sanitize()+" CASCADE")
		assert.NoError(t, err)
	})
	for _, body := range []string{"limit", "\xff\xfe"} {
		id := scopeID("refused " + body)
		tok := acquire(t, ctx, s, id, "fp")
		resp := created(body)
		require.ErrorIs(t, s.Complete(ctx, id, tok, resp, time.Hour), engine.ErrNotStorable, "body %q", body)
		require.NoError(t, s.Complete(ctx, id, tok, &engine.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}, time.Hour))
	}
	// A statement that failed for another reason is not one of them.
	id = scopeID("transient")
	tok = acquire(t, ctx, s, id, "fp")
	err = s.Complete(ctx, id, tok, created("transient"), time.Hour)
	require.Error(t, err)
	assert.NotErrorIs(t, err, engine.ErrNotStorable)
}

// In transactional mode the handler's writes and a response too large to
// store still commit, recorded as done without the body.
func TestTxCompleteNotStorable(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	orders := newOrders(t, pool)
	s, _ := newStore(t, pool, pgstore.WithTransactions())
	id := scopeID("too large")
	large := tooLarge()
	o, err := serve(ctx, s, id, "fp", func(ctx context.Context) (*engine.Response, error) {
		return large, placeOrder(ctx, orders, id.Key, 1)
	})
	require.NoError(t, err)
	require.True(t, o.executed)
	assert.Equal(t, 1, countOrders(t, ctx, pool, orders, id.Key))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, c.Status)
	assert.True(t, c.Response.BodyOmitted)
	assert.Empty(t, c.Response.Body)
	assert.Equal(t, large.Header, c.Response.Header)
}
