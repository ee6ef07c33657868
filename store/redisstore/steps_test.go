package redisstore_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// stepCommands are the commands that the functions run on a steps key, and
// on nothing else.
var stepCommands = []string{"del", "hset", "hdel", "hlen", "hexists", "hgetall", "pexpireat", "pexpiretime"}

func doneStep(name, result string) engine.Step {
	return engine.Step{Name: name, Fingerprint: "fp-" + name, Done: true, Result: []byte(result)}
}

// A steps key is in its record's slot, as the server itself hashes them
// (CLUSTER KEYSLOT, on a node of a Cluster of its own), whatever braces the
// prefix, the scope and the key hold.
func TestStepsKeySlot(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	ids := []engine.ID{
		{}, {Key: "k"}, {Scope: "tenant", Key: "order-1"}, {Key: "{"}, {Key: "}"}, {Key: "{}"}, {Key: "{x}"},
		{Scope: "{", Key: "}"}, {Scope: "}", Key: "{"}, {Scope: "a}", Key: "{b}"}, {Scope: "{}", Key: "x"},
		{Key: "}}}{{{"}, {Scope: "\x00\xff", Key: "{\x00}"}, {Key: strings.Repeat("{}", 100)},
	}
	for i := range 256 {
		ids = append(ids, engine.ID{Scope: "s", Key: string([]byte{byte(i), '}', byte(i)})})
	}
	type pair struct{ record, steps *redis.IntCmd }
	for _, prefix := range []string{
		"idempotency:", "", "{idem}:", "idem{", "idem{}:", "{", "}", "}{", "{}", "{}{x}", "a{b}c{", "x{{y}", "{s}",
	} {
		s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
		require.NoError(t, err)
		var pairs []pair
		_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range ids {
				pairs = append(pairs, pair{p.ClusterKeySlot(ctx, s.RecordKey(id)), p.ClusterKeySlot(ctx, redisstore.StepsKey(s, id))})
			}
			return nil
		})
		require.NoError(t, err)
		for i, p := range pairs {
			if p.record.Val() != p.steps.Val() {
				t.Errorf("prefix %q, ID %q: steps key %q in slot %d, record key %q in slot %d",
					prefix, ids[i], redisstore.StepsKey(s, ids[i]), p.steps.Val(), s.RecordKey(ids[i]), p.record.Val())
			}
		}
	}
}

// expiry returns the absolute expiry (ms since the epoch) of key: -1 for
// none, -2 for no key.
func expiry(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	at, err := c.Do(context.Background(), "PEXPIRETIME", key).Int64()
	require.NoError(t, err)
	return at
}

// A steps key expires when its record does, to the millisecond, from the
// first step on: after the step, an Extend, a Release and a re-acquiring
// Claim, each of which moves or keeps the record's expiry; a completion, a
// resolution and the record's expiry take it away.
func TestStepsKeyNeverOutlivesItsRecord(t *testing.T) {
	t.Parallel()
	s, c := sharedStore(t)
	ctx := context.Background()
	id := engine.ID{Scope: "t", Key: "expiry"}
	rk, sk := s.RecordKey(id), redisstore.StepsKey(s, id)
	same := func(when string) int64 {
		t.Helper()
		rat, sat := expiry(t, c, rk), expiry(t, c, sk)
		require.Positive(t, rat, "%s: the record's expiry", when)
		assert.Equal(t, rat, sat, "%s: the steps key's expiry (PEXPIRETIME), want the record's", when)
		rttl, err := c.PTTL(ctx, rk).Result()
		require.NoError(t, err)
		sttl, err := c.PTTL(ctx, sk).Result()
		require.NoError(t, err)
		assert.LessOrEqual(t, sttl, rttl, "%s: the steps key's PTTL, read after the record's", when)
		return rat
	}

	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, cl.Status)
	assert.Equal(t, int64(-2), expiry(t, c, sk), "a new record's steps key exists")
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
	first := same("after the first step")

	require.NoError(t, s.Extend(ctx, id, cl.Token, 2*time.Hour))
	extended := same("after Extend")
	assert.Greater(t, extended, first, "Extend moves the expiry")

	require.NoError(t, s.Release(ctx, id, cl.Token))
	assert.Equal(t, extended, same("after Release"), "Release keeps the expiry")

	cl, err = s.Claim(ctx, id, "fp", time.Minute, 3*time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, cl.Status)
	assert.Len(t, cl.Steps, 1)
	assert.Greater(t, same("after the Claim that re-acquired it"), extended, "the Claim gives a new expiry")

	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("b", "2")))
	same("after the second step")
	require.NoError(t, s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusCreated}, time.Hour))
	assert.Equal(t, int64(-2), expiry(t, c, sk), "the steps key after Complete")
	assert.Positive(t, expiry(t, c, rk), "the completed record's expiry")

	// Resolve takes the steps, with a response or without.
	for _, resp := range []*engine.Response{{Status: http.StatusOK}, nil} {
		id := engine.ID{Scope: "t", Key: "resolve-" + http.StatusText(map[bool]int{true: 200, false: 404}[resp != nil])}
		cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
		require.Positive(t, expiry(t, c, redisstore.StepsKey(s, id)))
		require.NoError(t, s.Resolve(ctx, id, resp, time.Hour))
		assert.Equal(t, int64(-2), expiry(t, c, redisstore.StepsKey(s, id)), "the steps key after Resolve(%v)", resp)
	}

	// A record that expires takes its steps with it: once the record is
	// gone, so are they (the same expiry, to the millisecond).
	short := engine.ID{Scope: "t", Key: "short"}
	cl, err = s.Claim(ctx, short, "fp", 50*time.Millisecond, 50*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, short, cl.Token, doneStep("a", "1")))
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := c.Exists(ctx, s.RecordKey(short)).Result()
		require.NoError(t, err)
		if n == 0 {
			break
		}
		require.False(t, time.Now().After(deadline), "the record outlived its expiry by seconds")
		time.Sleep(5 * time.Millisecond) // the record's own expiry, not a condition's
	}
	n, err := c.Exists(ctx, redisstore.StepsKey(s, short)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the steps key once its record expired")
}

// A first execution (a Claim of a new key and its Complete), and a claim
// released or extended, run no command on a steps key: the server's own
// count of the commands it ran (INFO commandstats, functions' included, on
// a redis-server of the test's own) shows none of those that the functions
// run on one, and no steps key exists after them. One step shows that the
// count sees them.
func TestFirstExecutionLeavesStepsAlone(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { admin.Close() })
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	require.NoError(t, err)
	// The library loaded, and the Store past its first function call.
	warm := engine.ID{Key: "warm-up"}
	cl, err := s.Claim(ctx, warm, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, warm, cl.Token, &engine.Response{Status: http.StatusOK}, time.Hour))

	const n = 20
	delta := func(run func(i int)) map[string]int64 {
		t.Helper()
		before, err := commandStats(ctx, admin)
		require.NoError(t, err)
		for i := range n {
			run(i)
		}
		after, err := commandStats(ctx, admin)
		require.NoError(t, err)
		d := map[string]int64{}
		for name, st := range after {
			if k := st.calls - before[name].calls; k != 0 && name != "info" {
				d[name] = k
			}
		}
		return d
	}
	first := delta(func(i int) {
		id := engine.ID{Key: "first-" + string(rune('a'+i))}
		cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.Equal(t, engine.Acquired, cl.Status)
		require.NoError(t, s.Complete(ctx, id, cl.Token, benchResponse(), time.Hour))
	})
	// SET NX PX GET; the completion's FCALL, and its GET and SET.
	assert.Equal(t, map[string]int64{"set": 2 * n, "fcall": n, "get": n}, first, "commands of %d first executions", n)
	released := delta(func(i int) {
		id := engine.ID{Key: "released-" + string(rune('a'+i))}
		cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.Extend(ctx, id, cl.Token, 2*time.Minute))
		require.NoError(t, s.Release(ctx, id, cl.Token))
	})
	for _, cmd := range stepCommands {
		assert.Zero(t, first[cmd], "%s in first executions", cmd)
		assert.Zero(t, released[cmd], "%s in claims extended and released: %v", cmd, released)
	}
	keys, err := admin.Keys(ctx, "idempotency:{*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "steps keys")

	// One step: the count sees the commands on the steps key.
	stepped := delta(func(i int) {
		id := engine.ID{Key: "stepped-" + string(rune('a'+i))}
		cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		require.NoError(t, err)
		require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
		require.NoError(t, s.Complete(ctx, id, cl.Token, benchResponse(), time.Hour))
	})
	assert.Equal(t, int64(n), stepped["hset"], "HSET in %d executions with a step: %v", n, stepped)
	assert.Equal(t, int64(2*n), stepped["del"], "DEL in %d executions with a step (one at the first step, one at Complete): %v", n, stepped)
}

// A step is one round trip, one function call; a Claim that re-acquires a
// record with steps is the two of any claim that finds a record in flight,
// and Lookup one.
func TestStepRoundTrips(t *testing.T) {
	t.Parallel()
	s, c := sharedStore(t)
	ctx := context.Background()
	warm := engine.ID{Key: "warm-up"}
	cl, err := s.Claim(ctx, warm, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, warm, cl.Token))
	counter := &commandCounter{}
	c.AddHook(counter)

	id := engine.ID{Scope: "s", Key: "k"}
	var tok engine.Token
	for _, op := range []struct {
		name string
		want []string
		fn   func() error
	}{
		{"Claim (new)", []string{"set"}, func() error {
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			tok = c.Token
			return err
		}},
		{"SaveStep (first)", []string{"fcall"}, func() error { return s.SaveStep(ctx, id, tok, doneStep("a", "1")) }},
		{"SaveStep", []string{"fcall"}, func() error { return s.SaveStep(ctx, id, tok, doneStep("b", "2")) }},
		{"SaveStep (remove)", []string{"fcall"}, func() error { return s.SaveStep(ctx, id, tok, engine.Step{Name: "b"}) }},
		{"Extend", []string{"fcall"}, func() error { return s.Extend(ctx, id, tok, time.Minute) }},
		{"Release", []string{"fcall"}, func() error { return s.Release(ctx, id, tok) }},
		{"Claim (after release, with steps)", []string{"set", "fcall"}, func() error {
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if len(c.Steps) != 1 {
				t.Errorf("Claim after release returned %d steps, want 1", len(c.Steps))
			}
			tok = c.Token
			return err
		}},
		{"Lookup", []string{"fcall"}, func() error {
			r, err := s.Lookup(ctx, id)
			if len(r.Steps) != 1 {
				t.Errorf("Lookup returned %d steps, want 1", len(r.Steps))
			}
			return err
		}},
		{"Complete", []string{"fcall"}, func() error { return s.Complete(ctx, id, tok, &engine.Response{Status: 200}, time.Hour) }},
	} {
		require.NoError(t, op.fn(), op.name)
		if got := counter.take(); !slices.Equal(got, op.want) {
			t.Errorf("%s sent %q, want %q", op.name, got, op.want)
		}
	}
}

// Steps that a record deleted by hand left behind (its steps key lives
// until its own expiry) are not the steps of the key's next record: its
// first step starts them afresh.
func TestStepsOfADeletedRecord(t *testing.T) {
	t.Parallel()
	s, c := sharedStore(t)
	ctx := context.Background()
	id := engine.ID{Key: "deleted"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("old", "1")))
	require.NoError(t, c.Del(ctx, s.RecordKey(id)).Err())

	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, cl.Status)
	assert.Empty(t, cl.Steps, "a new record's steps")
	r, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Empty(t, r.Steps, "Lookup of a new record")
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("new", "2")))
	require.NoError(t, s.Release(ctx, id, cl.Token))
	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Len(t, cl.Steps, 1)
	assert.Equal(t, "new", cl.Steps[0].Name)
}

// A steps key that holds something else than steps is a corrupt record to
// every operation that reads it, never a script error; a completion, which
// only deletes it, completes.
func TestStepsKeyOfAnotherType(t *testing.T) {
	t.Parallel()
	s, c := sharedStore(t)
	ctx := context.Background()
	id := engine.ID{Key: "wrongtype"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
	require.NoError(t, c.Set(ctx, redisstore.StepsKey(s, id), "not steps", time.Hour).Err())

	_, err = s.Lookup(ctx, id)
	assert.ErrorIs(t, err, redisstore.ErrCorruptRecord, "Lookup")
	assert.ErrorIs(t, s.SaveStep(ctx, id, cl.Token, doneStep("b", "2")), redisstore.ErrCorruptRecord, "SaveStep")
	assert.ErrorIs(t, s.SaveStep(ctx, id, cl.Token, engine.Step{Name: "a"}), redisstore.ErrCorruptRecord, "SaveStep (remove)")
	assert.ErrorIs(t, s.Release(ctx, id, cl.Token), redisstore.ErrCorruptRecord, "Release")
	require.NoError(t, s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusOK}, time.Hour))
	n, err := c.Exists(ctx, redisstore.StepsKey(s, id)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the steps key after Complete")

	// Steps that do not decode.
	id = engine.ID{Key: "undecodable"}
	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
	require.NoError(t, c.HSet(ctx, redisstore.StepsKey(s, id), "a", "\xff").Err())
	_, err = s.Lookup(ctx, id)
	assert.ErrorIs(t, err, redisstore.ErrCorruptRecord, "Lookup of a step that does not decode")
}

// A Redis that holds the library of the release before steps (the store's
// functions as they were, kept in testdata) gets this release's library
// beside it, and the two do not mix: every function of the earlier one
// refuses a record that holds steps as corrupt, and changes nothing, so
// that an instance of the earlier release answers 503 for that key (as
// for any record it cannot read) rather than drop the steps or take the
// lease.
func TestEarlierLibraryRefusesSteps(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	const earlier = "idempotency_9f5c7f424761"
	code, err := os.ReadFile("testdata/" + earlier + ".lua")
	require.NoError(t, err)
	require.NoError(t, c.FunctionLoad(ctx, string(code)).Err())

	s, err := redisstore.New(c)
	require.NoError(t, err)
	require.NotEqual(t, earlier, redisstore.LibraryName(s))
	// A tombstone and a completed record, as the earlier release writes
	// them too, for its functions' arguments.
	other := engine.ID{Key: "other"}
	cl, err := s.Claim(ctx, other, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, other, cl.Token))
	tomb, err := c.Get(ctx, s.RecordKey(other)).Result()
	require.NoError(t, err)
	cl, err = s.Claim(ctx, other, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, other, cl.Token, &engine.Response{Status: http.StatusOK}, time.Hour))
	completed, err := c.Get(ctx, s.RecordKey(other)).Result()
	require.NoError(t, err)

	id := engine.ID{Key: "with-steps"}
	key := s.RecordKey(id)
	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	inFlight, err := c.Get(ctx, key).Result()
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("charge", "ch_1")))
	rec, err := c.Get(ctx, key).Result()
	require.NoError(t, err)
	held := inFlight[:10] // version, state in flight, token

	for _, call := range []struct {
		fn   string
		args []any
	}{
		{"claim", []any{inFlight, 60000}},
		{"complete", []any{held, completed, 60000}},
		{"release", []any{held, tomb}},
		{"extend", []any{held, 60000}},
		{"lookup", nil},
		{"resolve", []any{completed, 60000}},
		{"resolve", []any{tomb}},
	} {
		reply, err := c.FCall(ctx, earlier+"_"+call.fn, []string{key}, call.args...).Result()
		require.NoError(t, err, "the earlier %s", call.fn)
		assert.Equal(t, []any{int64(0), "unknown record state 4"}, reply, "the earlier %s on a record with steps", call.fn)
		got, err := c.Get(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, rec, got, "the record after the earlier %s", call.fn)
	}
	libs := libraries(t, c)
	slices.Sort(libs)
	want := []string{earlier, redisstore.LibraryName(s)}
	slices.Sort(want)
	assert.Equal(t, want, libs, "the server's libraries")

	// This release still holds the lease, and the step.
	r, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, cl.Token, r.Token)
	require.Len(t, r.Steps, 1)
	require.NoError(t, s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusCreated}, time.Hour))
}

// The holder that created a record with steps releases it: its abandoned
// count is -1 until the next takeover makes it 0 again. Lookup and a
// resolution in between report 0, never the count's 32-bit form.
func TestReleasedByItsCreator(t *testing.T) {
	t.Parallel()
	s, _ := sharedStore(t)
	ctx := context.Background()
	id := engine.ID{Key: "creator"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
	require.NoError(t, s.Release(ctx, id, cl.Token))
	r, err := s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Zero(t, r.Abandoned, "Lookup's Abandoned after the creator's release")
	assert.False(t, r.Completed)
	assert.Len(t, r.Steps, 1)
	assert.False(t, r.LeaseEnds.After(time.Now().Add(time.Second)), "the lease ends at the release: %v", r.LeaseEnds)
	require.NoError(t, s.Resolve(ctx, id, &engine.Response{Status: http.StatusOK}, time.Hour))
	r, err = s.Lookup(ctx, id)
	require.NoError(t, err)
	assert.Zero(t, r.Abandoned, "Lookup's Abandoned after Resolve")
	assert.True(t, r.Completed)
	assert.Empty(t, r.Steps)
}

// A record whose steps key was deleted by hand holds no steps: its
// creator's release makes the key new again, as for any record without
// steps, and a takeover finds none.
func TestStepsKeyDeletedByHand(t *testing.T) {
	t.Parallel()
	s, c := sharedStore(t)
	ctx := context.Background()
	id := engine.ID{Key: "released"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
	require.NoError(t, c.Del(ctx, redisstore.StepsKey(s, id)).Err())
	require.NoError(t, s.Release(ctx, id, cl.Token))
	cl, err = s.Claim(ctx, id, "other-fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, cl.Status, "a claim with another fingerprint after the release")
	assert.Empty(t, cl.Steps)

	id = engine.ID{Key: "taken-over"}
	const lease = 30 * time.Millisecond
	cl, err = s.Claim(ctx, id, "fp", lease, time.Hour)
	require.NoError(t, err)
	require.NoError(t, s.SaveStep(ctx, id, cl.Token, doneStep("a", "1")))
	require.NoError(t, c.Del(ctx, redisstore.StepsKey(s, id)).Err())
	waitLeaseEnd(t, func() (engine.Claim, error) { return s.Claim(ctx, id, "other-fp", lease, time.Hour) })
	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, cl.Status)
	assert.Equal(t, 1, cl.Abandoned)
	assert.Empty(t, cl.Steps, "the steps of a takeover")
	// The record is in flight without steps again (state 1, not 4).
	v, err := c.Get(ctx, s.RecordKey(id)).Result()
	require.NoError(t, err)
	assert.Equal(t, byte(1), v[1], "the record's state after a takeover found no steps")
}
