package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) engine.Store {
		s, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestRecordBound(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.WithMaxRecords(10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var tokens []engine.Token
	for i := range 10 {
		c, err := s.Claim(ctx, engine.ID{Key: strconv.Itoa(i)}, "fp", time.Minute, time.Hour)
		if err != nil || c.Status != engine.Acquired {
			t.Fatalf("Claim %d = %v, %v; want acquired", i, c.Status, err)
		}
		tokens = append(tokens, c.Token)
	}
	_, err = s.Claim(ctx, engine.ID{Key: "one too many"}, "fp", time.Minute, time.Hour)
	if !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("Claim beyond the bound error = %v, want ErrFull", err)
	}
	// Every live record is still there: none was evicted.
	for i := range 10 {
		c, err := s.Claim(ctx, engine.ID{Key: strconv.Itoa(i)}, "fp", time.Minute, time.Hour)
		if err != nil || c.Status != engine.InFlight {
			t.Fatalf("Claim %d at the bound = %v, %v; want in flight", i, c.Status, err)
		}
	}
	// Releasing one makes room for one.
	if err := s.Release(ctx, engine.ID{Key: "0"}, tokens[0]); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Claim(ctx, engine.ID{Key: "new"}, "fp", time.Minute, time.Hour); err != nil || c.Status != engine.Acquired {
		t.Fatalf("Claim after a release = %v, %v; want acquired", c.Status, err)
	}
	if got := s.Len(); got != 10 {
		t.Errorf("Len() = %d, want 10", got)
	}
}

func TestExpiredRecordsMakeRoom(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.WithMaxRecords(1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Claim(ctx, engine.ID{Key: "a"}, "fp", time.Millisecond, time.Millisecond)
	if err != nil || c.Status != engine.Acquired {
		t.Fatalf("Claim = %v, %v", c.Status, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := s.Claim(ctx, engine.ID{Key: "b"}, "fp", time.Minute, time.Hour)
		if err == nil && c.Status == engine.Acquired {
			break
		}
		if !errors.Is(err, memstore.ErrFull) || time.Now().After(deadline) {
			t.Fatalf("Claim once the only record expired = %v, %v; want acquired", c.Status, err)
		}
	}
}

func TestByteBoundKeepsRecord(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.WithMaxBytes(64 << 10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := engine.ID{Key: "big"}
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/7"}}, Body: make([]byte, 128<<10)}
	if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
		t.Fatalf("Complete beyond the byte bound error = %v", err)
	}
	got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Completed {
		t.Fatalf("Claim after Complete = %v, %v; want completed", got.Status, err)
	}
	if !got.Response.BodyOmitted || len(got.Response.Body) != 0 {
		t.Errorf("stored response BodyOmitted = %v with %d body bytes, want the body omitted", got.Response.BodyOmitted, len(got.Response.Body))
	}
	if got.Response.Status != http.StatusCreated || http.Header(got.Response.Header).Get("Location") != "/orders/7" {
		t.Errorf("stored response = %d %v, want the status and headers kept", got.Response.Status, got.Response.Header)
	}
	if b := s.Bytes(); b > 64<<10 {
		t.Errorf("Bytes() = %d, want at most %d", b, 64<<10)
	}
}

// TestHeadersBeyondByteBound: a response whose headers alone do not fit is
// kept with its status only, and the store stays within its bound but for
// that: the request is still never run again.
func TestHeadersBeyondByteBound(t *testing.T) {
	ctx := context.Background()
	const bound = 1024
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
	resp := &engine.Response{Status: http.StatusCreated, Header: http.Header{"X-Big": {string(make([]byte, 2*bound))}}, Body: []byte("x")}
	if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
		t.Fatalf("Complete with headers beyond the byte bound error = %v", err)
	}
	got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Completed {
		t.Fatalf("Claim after Complete = %v, %v; want completed", got.Status, err)
	}
	if got.Response.Status != http.StatusCreated || !got.Response.BodyOmitted || len(got.Response.Header) != 0 || len(got.Response.Body) != 0 {
		t.Errorf("stored response = %d, %d headers, %d body bytes, BodyOmitted %v; want 201 alone, BodyOmitted",
			got.Response.Status, len(got.Response.Header), len(got.Response.Body), got.Response.BodyOmitted)
	}
	if b := s.Bytes(); b > bound {
		t.Errorf("Bytes() = %d, want at most %d", b, bound)
	}
}

// TestClaimsCountTowardByteBound: records in flight take memory too, so
// claims that are never completed cannot take the store past its byte bound.
func TestClaimsCountTowardByteBound(t *testing.T) {
	ctx := context.Background()
	const bound = 20_000
	s, err := memstore.New(memstore.WithMaxBytes(bound))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := strings.Repeat("k", 252)
	acquired := 0
	var full error
	for i := range 200 {
		c, err := s.Claim(ctx, engine.ID{Key: key + fmt.Sprintf("%03d", i)}, "fp", time.Minute, time.Hour)
		if err != nil {
			full = err
			break
		}
		if c.Status != engine.Acquired {
			t.Fatalf("Claim %d = %v, want acquired", i, c.Status)
		}
		acquired++
	}
	if !errors.Is(full, memstore.ErrFull) {
		t.Fatalf("Claim past the byte bound error = %v after %d claims, want ErrFull", full, acquired)
	}
	if b := s.Bytes(); b > bound {
		t.Errorf("Bytes() = %d, want at most %d", b, bound)
	}
	if got := s.Len(); got != acquired {
		t.Errorf("Len() = %d, want %d: a refused claim keeps nothing", got, acquired)
	}
}

func TestSweep(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.WithSweepInterval(10 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 100 {
		if _, err := s.Claim(ctx, engine.ID{Key: strconv.Itoa(i)}, "fp", time.Millisecond, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for s.Len() != 0 || s.Bytes() != 0 {
		select {
		case <-deadline:
			t.Fatalf("after the sweep Len() = %d, Bytes() = %d; want 0, 0", s.Len(), s.Bytes())
		case <-tick.C:
		}
	}
}

func TestClose(t *testing.T) {
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close error = %v", err)
	}
	if _, err := s.Claim(context.Background(), engine.ID{Key: "k"}, "fp", time.Minute, time.Hour); !errors.Is(err, memstore.ErrClosed) {
		t.Errorf("Claim after Close error = %v, want ErrClosed", err)
	}
}

func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	// Bounds that a run of any length stays under: every iteration keeps
	// a record.
	s, err := memstore.New(memstore.WithMaxRecords(1<<30), memstore.WithMaxBytes(1<<40))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	resp := &engine.Response{Status: http.StatusCreated, Body: make([]byte, 1024)}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		prefix := fmt.Sprintf("%p", pb)
		for pb.Next() {
			i++
			id := engine.ID{Scope: prefix, Key: strconv.Itoa(i)}
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestNewValidates: invalid options make New fail, naming each, and make no
// Store.
func TestNewValidates(t *testing.T) {
	s, err := memstore.New(memstore.WithMaxRecords(0), memstore.WithMaxBytes(-1), nil, memstore.WithSweepInterval(time.Microsecond))
	if err == nil {
		s.Close()
		t.Fatal("New with invalid options error = nil")
	}
	if got := len(strings.Split(err.Error(), "\n")); got != 4 {
		t.Errorf("New error has %d lines, want 4, one per invalid option: %q", got, err)
	}
	for _, want := range []string{"memstore: record bound 0", "memstore: byte bound -1", "memstore: option 2 is nil", "memstore: sweep interval 1µs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error = %q, want it to name %q", err, want)
		}
	}
	if s != nil {
		t.Errorf("New with invalid options returned a Store")
	}
}

// TestErrorText: a wrapped sentinel reads once, with the package and the
// operation.
func TestErrorText(t *testing.T) {
	s, err := memstore.New(memstore.WithMaxRecords(1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Claim(ctx, engine.ID{Key: "a"}, "fp", time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, engine.ID{Key: "b"}, "fp", time.Minute, time.Hour)
	if got, want := fmt.Sprint(err), "memstore: claim: store full"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
}
