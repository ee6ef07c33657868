package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
	"github.com/idemkit/idempotency/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	s, _ := sharedStore(t)
	storetest.Run(t, func(*testing.T) engine.Store { return s })
}

func TestNewNilClient(t *testing.T) {
	if _, err := redisstore.New(nil); err == nil {
		t.Error("New(nil) error = nil, want an error")
	}
}

// Two API instances, each with its own client and Store, share one Redis:
// of 64 concurrent claims spread over both, exactly one acquires, and the
// other instance replays what the winner stored.
func TestConcurrentClaimersAcrossStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first := sharedClient(t)
	prefix := testPrefix(t, first)
	var stores [2]redisstore.Store
	for i, c := range []*redis.Client{first, sharedClient(t)} {
		s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	const claimers, rounds = 64, 20
	for round := range rounds {
		id := engine.ID{Scope: "tenant", Key: "order-" + string(rune('a'+round))}
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			winners atomic.Int32
			winner  atomic.Int32
			token   atomic.Int64
			errs    = make(chan error, claimers)
		)
		for i := range claimers {
			wg.Go(func() {
				<-start
				c, err := stores[i%2].Claim(ctx, id, "fp", time.Minute, time.Hour)
				switch {
				case err != nil:
					errs <- err
				case c.Status == engine.Acquired:
					winners.Add(1)
					winner.Store(int32(i % 2))
					token.Store(int64(c.Token))
				case c.Status != engine.InFlight:
					errs <- errors.New("status " + c.Status.String())
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: Claim error = %v", round, err)
		}
		if n := winners.Load(); n != 1 {
			t.Fatalf("round %d: %d of %d claimers acquired, want exactly 1", round, n, claimers)
		}
		w := winner.Load()
		want := &engine.Response{Status: http.StatusCreated, Body: []byte(id.Key)}
		if err := stores[w].Complete(ctx, id, engine.Token(token.Load()), want, time.Hour); err != nil {
			t.Fatalf("round %d: Complete error = %v", round, err)
		}
		c, err := stores[1-w].Claim(ctx, id, "fp", time.Minute, time.Hour)
		if err != nil || c.Status != engine.Completed || string(c.Response.Body) != id.Key {
			t.Fatalf("round %d: Claim on the other Store = %v, %v; want the completed response", round, c.Status, err)
		}
	}
}

// commandCounter is a go-redis hook that counts the commands sent.
type commandCounter struct {
	mu    sync.Mutex
	names []string
}

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.names = append(h.names, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, cmd := range cmds {
			h.names = append(h.names, cmd.Name())
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *commandCounter) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := h.names
	h.names = nil
	return names
}

// Every operation is one command, one round trip, but a claim that finds a
// record in flight or released, which is two: SET NX PX GET, which found
// it, then the claim function.
func TestOneRoundTripPerOperation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)
	// The first call on a server without the functions is FCALL, FUNCTION
	// LOAD and FCALL again: do that before counting.
	warm := engine.ID{Key: "warm-up"}
	if cl, err := s.Claim(ctx, warm, "fp", time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	} else {
		s.Extend(ctx, warm, cl.Token, time.Minute)
		s.Release(ctx, warm, cl.Token)
		s.Complete(ctx, warm, cl.Token, &engine.Response{Status: 200}, time.Hour)
	}
	counter := &commandCounter{}
	c.AddHook(counter)

	id := engine.ID{Scope: "s", Key: "k"}
	var tok engine.Token
	resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte("{}")}
	for _, op := range []struct {
		name string
		fn   func() error
	}{
		{"Claim (acquired)", func() error {
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			tok = c.Token
			return err
		}},
		{"Claim (in flight)", func() error { _, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour); return err }},
		{"Extend", func() error { return s.Extend(ctx, id, tok, time.Minute) }},
		{"Release", func() error { return s.Release(ctx, id, tok) }},
		{"Release (lease lost)", func() error {
			if err := s.Release(ctx, id, tok); !errors.Is(err, engine.ErrLeaseLost) {
				return err
			}
			return nil
		}},
		{"Claim (after release)", func() error {
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			tok = c.Token
			return err
		}},
		{"Complete", func() error { return s.Complete(ctx, id, tok, resp, time.Hour) }},
		{"Claim (replay)", func() error { _, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour); return err }},
	} {
		if err := op.fn(); err != nil {
			t.Fatalf("%s error = %v", op.name, err)
		}
		want := []string{"fcall"}
		switch op.name {
		case "Claim (acquired)", "Claim (replay)":
			want = []string{"set"}
		case "Claim (in flight)", "Claim (after release)":
			want = []string{"set", "fcall"}
		}
		if got := counter.take(); !slices.Equal(got, want) {
			t.Errorf("%s sent %q, want %q", op.name, got, want)
		}
	}
}

// repeater is a go-redis hook that sends every function call, and every
// SET (the claim's own command), twice, as the client does when the reply
// to the first was lost.
type repeater struct{}

func (repeater) DialHook(next redis.DialHook) redis.DialHook { return next }

func (repeater) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" || cmd.Name() == "set" {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (repeater) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A call that reaches Redis twice recognises its own effect the second time.
func TestRepeatedCallsRecogniseThemselves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)
	c.AddHook(repeater{})

	id := engine.ID{Key: "repeated"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || cl.Status != engine.Acquired {
		t.Fatalf("repeated Claim = %v, %v; want acquired", cl.Status, err)
	}
	if err := s.Extend(ctx, id, cl.Token, time.Minute); err != nil {
		t.Fatalf("repeated Extend error = %v", err)
	}
	if err := s.Release(ctx, id, cl.Token); err != nil {
		t.Fatalf("repeated Release error = %v", err)
	}
	cl2, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || cl2.Status != engine.Acquired || cl2.Token <= cl.Token {
		t.Fatalf("repeated Claim after Release = %v %d, %v; want acquired with a token > %d", cl2.Status, cl2.Token, err, cl.Token)
	}
	if err := s.Complete(ctx, id, cl2.Token, &engine.Response{Status: http.StatusOK}, time.Hour); err != nil {
		t.Fatalf("repeated Complete error = %v", err)
	}
	// Distinct calls are still told apart.
	if err := s.Complete(ctx, id, cl2.Token, &engine.Response{Status: http.StatusOK}, time.Hour); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("second Complete error = %v, want ErrLeaseLost", err)
	}
	other := engine.ID{Key: "repeated-other"}
	if _, err := s.Claim(ctx, other, "fp", time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	if cl, err := s.Claim(ctx, other, "fp", time.Minute, time.Hour); err != nil || cl.Status != engine.InFlight {
		t.Errorf("second Claim = %v, %v; want in flight", cl.Status, err)
	}

	// With steps: a step, its removal, a release that keeps the steps and
	// a claim that re-acquires them, each sent twice.
	stepped := engine.ID{Key: "repeated-steps"}
	cl, err = s.Claim(ctx, stepped, "fp", time.Minute, time.Hour)
	if err != nil || cl.Status != engine.Acquired {
		t.Fatalf("repeated Claim = %v, %v; want acquired", cl.Status, err)
	}
	for _, st := range []engine.Step{
		{Name: "a", Fingerprint: "fa", Done: true, Result: []byte("1")},
		{Name: "b", Fingerprint: "fb", Done: true, Result: []byte("2")},
		{Name: "b"},
	} {
		if err := s.SaveStep(ctx, stepped, cl.Token, st); err != nil {
			t.Fatalf("repeated SaveStep(%q) error = %v", st.Name, err)
		}
	}
	if err := s.Release(ctx, stepped, cl.Token); err != nil {
		t.Fatalf("repeated Release of a record with steps error = %v", err)
	}
	cl2, err = s.Claim(ctx, stepped, "fp", time.Minute, time.Hour)
	if err != nil || cl2.Status != engine.Acquired || cl2.Abandoned != 0 || len(cl2.Steps) != 1 || cl2.Steps[0].Name != "a" {
		t.Fatalf("repeated Claim after Release = %v, Abandoned %d, steps %+v, %v; want acquired, 0, step a", cl2.Status, cl2.Abandoned, cl2.Steps, err)
	}
	if err := s.Complete(ctx, stepped, cl2.Token, &engine.Response{Status: http.StatusOK}, time.Hour); err != nil {
		t.Fatalf("repeated Complete of a record with steps error = %v", err)
	}
}

// A record that cannot be decoded is a store error for every operation,
// never a replay, and never mistaken for a lost lease.
func TestCorruptRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)

	// A real completed record, to truncate.
	done := engine.ID{Key: "completed"}
	cl, err := s.Claim(ctx, done, "fp", time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
	if err := s.Complete(ctx, done, cl.Token, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	completed, err := c.Get(ctx, s.RecordKey(done)).Result()
	if err != nil {
		t.Fatal(err)
	}
	header := func(version, state byte) string {
		h := []byte(completed[:30])
		h[0], h[1] = version, state
		return string(h)
	}

	for _, tc := range []struct {
		name  string
		write func(key string) error
		// header is set when the fixed header itself is bad, so that
		// Complete, Release and Extend fail on it too; otherwise only Claim
		// reads far enough to see it.
		header bool
	}{
		{"garbage", setTo(c, "garbage"), true},
		{"empty", setTo(c, ""), true},
		{"unknown version", setTo(c, header(9, 2)+completed[30:]), true},
		{"version 0", setTo(c, header(0, 2)+completed[30:]), true},
		{"unknown state", setTo(c, header(2, 7)+completed[30:]), true},
		{"unknown state, version 1", setTo(c, header(1, 0)+completed[30:]), true},
		{"truncated header", setTo(c, completed[:29]), true},
		{"truncated body", setTo(c, completed[:len(completed)-1]), false},
		{"truncated response", setTo(c, completed[:40]), false},
		{"trailing bytes", setTo(c, completed+"x"), false},
		{"trailing bytes in flight", setTo(c, header(2, 1)+completed[30:]), true},
		{"trailing bytes in flight, version 1", setTo(c, header(1, 1)+completed[30:]), true},
		{"trailing bytes released", setTo(c, header(2, 3)+completed[30:]), true},
		{"a hash", func(key string) error { return c.HSet(ctx, key, "state", "completed").Err() }, true},
		{"a list", func(key string) error { return c.RPush(ctx, key, "x").Err() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := engine.ID{Scope: "corrupt", Key: tc.name}
			if err := tc.write(s.RecordKey(id)); err != nil {
				t.Fatal(err)
			}
			cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if !errors.Is(err, redisstore.ErrCorruptRecord) {
				t.Fatalf("Claim = %v, %v; want ErrCorruptRecord", cl.Status, err)
			}
			if errors.Is(err, engine.ErrLeaseLost) || cl.Response != nil || cl.Status != 0 {
				t.Errorf("Claim = %+v, %v; want nothing but a store error", cl, err)
			}
			if !strings.HasPrefix(err.Error(), "redisstore: claim: ") {
				t.Errorf("Claim error = %q, want the prefix %q", err, "redisstore: claim: ")
			}
			if !tc.header {
				return
			}
			for op, err := range map[string]error{
				"Complete": s.Complete(ctx, id, cl.Token, resp, time.Hour),
				"Release":  s.Release(ctx, id, cl.Token),
				"Extend":   s.Extend(ctx, id, cl.Token, time.Minute),
			} {
				if !errors.Is(err, redisstore.ErrCorruptRecord) {
					t.Errorf("%s error = %v, want ErrCorruptRecord", op, err)
				}
			}
		})
	}
}

func setTo(c *redis.Client, value string) func(key string) error {
	return func(key string) error { return c.Set(context.Background(), key, value, time.Hour).Err() }
}

// Distinct IDs have distinct keys, however their bytes line up: checked over
// every scope and key of up to three characters from an alphabet chosen to
// make the encoding's separators and digits ambiguous.
func TestRecordKeyInjective(t *testing.T) {
	c := redis.NewClient(&redis.Options{})
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	alphabet := []string{":", "1", "a", "{"}
	words := []string{""}
	for n, frontier := 0, []string{""}; n < 3; n++ {
		var next []string
		for _, w := range frontier {
			for _, c := range alphabet {
				next = append(next, w+c)
			}
		}
		words = append(words, next...)
		frontier = next
	}
	seen := make(map[string]engine.ID, len(words)*len(words))
	for _, scope := range words {
		for _, key := range words {
			id := engine.ID{Scope: scope, Key: key}
			k := s.RecordKey(id)
			if prev, dup := seen[k]; dup {
				t.Fatalf("RecordKey(%q) = RecordKey(%q) = %q", id, prev, k)
			}
			seen[k] = id
		}
	}
}

// The IDs that a naive "scope:key" would confuse are separate records.
func TestLookalikeIDsAreSeparate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := sharedStore(t)
	for _, pair := range [][2]engine.ID{
		{{Scope: "a:b", Key: "c"}, {Scope: "a", Key: "b:c"}},
		{{Scope: "", Key: "1:a:b"}, {Scope: "1:a", Key: "b"}},
		{{Scope: "10", Key: ""}, {Scope: "1", Key: "0"}},
	} {
		a, b := pair[0], pair[1]
		if s.RecordKey(a) == s.RecordKey(b) {
			t.Errorf("RecordKey(%q) = RecordKey(%q) = %q", a, b, s.RecordKey(a))
		}
		cl, err := s.Claim(ctx, a, "fp", time.Minute, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, a, cl.Token, &engine.Response{Status: http.StatusOK}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if cl, err := s.Claim(ctx, b, "fp", time.Minute, time.Hour); err != nil || cl.Status != engine.Acquired {
			t.Errorf("Claim(%q) after completing %q = %v, %v; want acquired", b, a, cl.Status, err)
		}
	}
}

// Records expire by Redis's TTL: the claim sets the lease and the TTL after
// it, Complete the TTL, Extend moves the expiry with the lease's end (never
// sooner), Release keeps it.
func TestRecordTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)
	id := engine.ID{Key: "ttl"}
	key := s.RecordKey(id)
	pttl := func(op string, lo, hi time.Duration) {
		t.Helper()
		got, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got < lo || got > hi {
			t.Errorf("after %s PTTL = %v, want in [%v, %v]", op, got, lo, hi)
		}
	}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pttl("Claim", 10*time.Minute+59*time.Second, 11*time.Minute)
	if err := s.Extend(ctx, id, cl.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	pttl("Extend beyond the TTL", 69*time.Minute, 70*time.Minute)
	if err := s.Extend(ctx, id, cl.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	pttl("a shorter Extend", 69*time.Minute, 70*time.Minute)
	if err := s.Release(ctx, id, cl.Token); err != nil {
		t.Fatal(err)
	}
	pttl("Release", 69*time.Minute, 70*time.Minute)
	cl, err = s.Claim(ctx, id, "fp", 2*time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pttl("Claim with a lease longer than the TTL", 179*time.Minute, 3*time.Hour)
	if err := s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusOK}, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	pttl("Complete", 4*time.Minute, 5*time.Minute)
}

// A token is larger than the record's last one even when the Redis clock is
// behind that token, as after a failover to a server whose clock is late:
// here the record's token is set an hour ahead of the clock.
func TestTokenOutrunsALateClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)
	id := engine.ID{Key: "late-clock"}
	key := s.RecordKey(id)
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ahead := cl.Token + engine.Token(time.Hour/time.Microsecond)
	rec, err := c.Get(ctx, key).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint64(rec[2:10], uint64(ahead)) // the token, see the layout
	if err := c.Set(ctx, key, rec, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, id, ahead); err != nil {
		t.Fatalf("Release with the rewritten token error = %v", err)
	}
	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || cl.Status != engine.Acquired {
		t.Fatalf("Claim after Release = %v, %v; want acquired", cl.Status, err)
	}
	if cl.Token != ahead+1 {
		t.Errorf("Claim token = %d, want %d, one more than the last", cl.Token, ahead+1)
	}
}

// A lease completed by another Store than the one that granted it (which
// does not know its fingerprint) stores the record's fingerprint.
func TestCompleteByAnotherStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := sharedClient(t)
	prefix := testPrefix(t, c)
	a, err := redisstore.New(c, redisstore.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	b, err := redisstore.New(c, redisstore.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	id := engine.ID{Scope: "s", Key: "k"}
	cl, err := a.Claim(ctx, id, "fp\x00\xff", time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(`{"id":1}`)}
	if err := b.Complete(ctx, id, cl.Token, want, time.Hour); err != nil {
		t.Fatalf("Complete by the other Store error = %v", err)
	}
	got, err := a.Claim(ctx, id, "other", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Completed || got.Fingerprint != "fp\x00\xff" ||
		string(got.Response.Body) != `{"id":1}` || http.Header(got.Response.Header).Get("Location") != "/orders/1" {
		t.Errorf("Claim = %+v, %v; want the completed response and fingerprint", got, err)
	}
	// The Store that granted the lease completes nothing twice.
	if err := a.Complete(ctx, id, cl.Token, want, time.Hour); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("Complete by the granting Store after the other's error = %v, want ErrLeaseLost", err)
	}
}
