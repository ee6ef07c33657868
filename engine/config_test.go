package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// TestNewRefuses: New names every invalid field of the configuration, one
// message each, and refuses a nil store.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		want []string
	}{
		{"TTL too short", engine.Config{TTL: 5 * time.Millisecond},
			[]string{"engine: TTL 5ms is shorter than 10ms"}},
		{"TTL negative", engine.Config{TTL: -time.Second},
			[]string{"engine: TTL -1s is shorter than 10ms"}},
		{"lease too short", engine.Config{Lease: time.Millisecond},
			[]string{"engine: lease 1ms is shorter than 10ms"}},
		{"lease negative", engine.Config{Lease: -time.Minute},
			[]string{"engine: lease -1m0s is shorter than 10ms"}},
		{"lease longer than the TTL", engine.Config{TTL: time.Minute, Lease: time.Hour},
			[]string{"engine: lease 1h0m0s is longer than TTL 1m0s"}},
		{"lease longer than the default TTL", engine.Config{Lease: 25 * time.Hour},
			[]string{"engine: lease 25h0m0s is longer than TTL 24h0m0s"}},
		{"store timeout negative", engine.Config{StoreTimeout: -time.Second},
			[]string{"engine: store timeout -1s is negative"}},
		{"wait negative", engine.Config{Wait: -time.Millisecond},
			[]string{"engine: wait -1ms is negative"}},
		{"Retry-After negative", engine.Config{RetryAfter: -time.Second},
			[]string{"engine: Retry-After -1s is negative"}},
		{"unknown abandoned policy", engine.Config{Abandoned: engine.RefuseAbandoned + 1},
			[]string{"engine: unknown abandoned policy 2"}},
		{"every field at once",
			engine.Config{TTL: time.Millisecond, Lease: time.Millisecond, StoreTimeout: -1, Wait: -1, RetryAfter: -1, Abandoned: -1},
			[]string{
				"engine: TTL 1ms is shorter than 10ms",
				"engine: lease 1ms is shorter than 10ms",
				"engine: store timeout -1ns is negative",
				"engine: wait -1ns is negative",
				"engine: Retry-After -1ns is negative",
				"engine: unknown abandoned policy -1",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := engine.New(&fakeStore{}, tc.cfg)
			if err == nil {
				e.Shutdown(context.Background())
				t.Fatalf("New(%+v) = nil error, want %q", tc.cfg, tc.want)
			}
			if e != nil {
				t.Error("New returned an engine with its error")
			}
			if got := strings.Split(err.Error(), "\n"); !equal(got, tc.want) {
				t.Errorf("New(%+v) = %q, want %q", tc.cfg, got, tc.want)
			}
		})
	}
	t.Run("nil store", func(t *testing.T) {
		if _, err := engine.New(nil, engine.Config{}); err == nil || !strings.HasPrefix(err.Error(), "engine: ") {
			t.Errorf("New(nil) = %v, want an engine error", err)
		}
	})
	t.Run("nil pointer in the interface", func(t *testing.T) {
		var s *fakeStore
		if _, err := engine.New(s, engine.Config{}); err == nil {
			t.Error("New((*fakeStore)(nil)) = nil error, want one")
		}
	})
	t.Run("nil func as a store", func(t *testing.T) {
		var s funcStore
		if _, err := engine.New(s, engine.Config{}); err == nil {
			t.Error("New(funcStore(nil)) = nil error, want one")
		}
	})
}

// funcStore is a Store of another kind than a pointer, to show that New
// tells a nil one from a valid one whatever its kind.
type funcStore func() *fakeStore

func (f funcStore) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	return f().Claim(ctx, id, fp, lease, ttl)
}

func (f funcStore) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	return f().Complete(ctx, id, token, resp, ttl)
}

func (f funcStore) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	return f().Release(ctx, id, token)
}

func (f funcStore) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	return f().Extend(ctx, id, token, lease)
}

// TestNewAccepts: the bounds themselves, and durations past a century,
// are accepted; a Store of any kind that is not nil works.
func TestNewAccepts(t *testing.T) {
	store := &fakeStore{claims: []engine.Claim{fresh}}
	for _, cfg := range []engine.Config{
		{},
		{TTL: engine.MinLease},
		{TTL: engine.MinLease, Lease: engine.MinLease},
		{TTL: time.Duration(1<<63 - 1), Lease: time.Duration(1<<63 - 1)},
		{TTL: 200 * 365 * 24 * time.Hour},
		{Abandoned: engine.RefuseAbandoned, Wait: time.Hour, RetryAfter: time.Nanosecond, StoreTimeout: time.Nanosecond, FailOpen: true},
	} {
		e, err := engine.New(store, cfg)
		if err != nil {
			t.Errorf("New(%+v) = %v, want nil", cfg, err)
			continue
		}
		shutdown(t, e)
	}
	s := funcStore(func() *fakeStore { return store })
	e, err := engine.New(s, engine.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDoor{work: keep, store: store}
	e.Do(context.Background(), &d.call, engine.ID{Key: "k"}, "fp", d)
	shutdown(t, e)
	if store.after() != "completed" {
		t.Errorf("through a func Store, the record is %q, want completed", store.after())
	}
}
