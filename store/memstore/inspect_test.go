package memstore_test

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
)

// TestLookupWallClock: Lookup's times are wall-clock times, taken when the
// store's calls were made.
func TestLookupWallClock(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := engine.ID{Key: "k"}
	before := time.Now()
	if _, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	r, err := s.Lookup(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// The wall clock and the monotonic one may drift apart by a little
	// while the test runs.
	const slack = time.Millisecond
	for _, tc := range []struct {
		name string
		got  time.Time
		from time.Duration
	}{
		{"Created", r.Created, 0},
		{"LeaseEnds", r.LeaseEnds, time.Minute},
		{"Expires", r.Expires, time.Minute + time.Hour}, // the TTL after the lease
	} {
		lo, hi := before.Add(tc.from-slack), after.Add(tc.from+slack)
		if tc.got.Before(lo) || tc.got.After(hi) {
			t.Errorf("%s = %v, want within [%v, %v]", tc.name, tc.got, lo, hi)
		}
	}
}

// TestSweepKeepsRecordsThatNeverExpire: a record with the largest TTL
// survives the sweep, which removes the expired records beside it.
func TestSweepKeepsRecordsThatNeverExpire(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.WithSweepInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const forever = time.Duration(math.MaxInt64)
	kept := engine.ID{Key: "kept"}
	c, err := s.Claim(ctx, kept, "fp", time.Minute, forever)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, kept, c.Token, &engine.Response{Status: http.StatusCreated}, forever); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, engine.ID{Key: "gone"}, "fp", time.Nanosecond, time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s.Len() > 1 {
		select {
		case <-deadline:
			t.Fatalf("Len() = %d after 10s of sweeps, want 1", s.Len())
		case <-tick.C:
		}
	}
	if got, err := s.Claim(ctx, kept, "fp", time.Minute, forever); err != nil || got.Status != engine.Completed {
		t.Fatalf("Claim of the record with the largest TTL after a sweep = %v, %v; want completed", got.Status, err)
	}
}

// TestResolveAtByteBound: a response that Resolve cannot fit is kept without
// its body, as one from Complete is, and its room is accounted for.
func TestResolveAtByteBound(t *testing.T) {
	ctx := context.Background()
	const bound = 64 << 10
	s, err := memstore.New(memstore.WithMaxBytes(bound))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := engine.ID{Key: "k"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, c.Token, &engine.Response{Status: http.StatusCreated, Body: make([]byte, 1024)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	big := &engine.Response{Status: http.StatusOK, Header: http.Header{"Location": {"/orders/1"}}, Body: make([]byte, 2*bound)}
	if err := s.Resolve(ctx, id, big, time.Hour); err != nil {
		t.Fatalf("Resolve beyond the byte bound error = %v", err)
	}
	got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Completed {
		t.Fatalf("Claim after Resolve = %v, %v; want completed", got.Status, err)
	}
	if !got.Response.BodyOmitted || len(got.Response.Body) != 0 || got.Response.Status != http.StatusOK || http.Header(got.Response.Header).Get("Location") != "/orders/1" {
		t.Errorf("resolved response = %d %v, %d body bytes, BodyOmitted %v; want 200, its headers, the body omitted",
			got.Response.Status, got.Response.Header, len(got.Response.Body), got.Response.BodyOmitted)
	}
	if b := s.Bytes(); b > bound {
		t.Errorf("Bytes() = %d, want at most %d", b, bound)
	}
	// The replaced response's room was given back: forgetting the record
	// frees everything.
	if err := s.Resolve(ctx, id, nil, 0); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Errorf("after Resolve(nil) Len() = %d, Bytes() = %d; want 0, 0", s.Len(), s.Bytes())
	}
}
