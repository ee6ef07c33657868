package redisstore

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

func TestFingerprintsBounded(t *testing.T) {
	f := newFingerprints()
	for i := range maxFingerprints + 10 {
		f.put(leaseKey{"k", engine.Token(i)}, leaseFacts{fingerprint: "fp"})
		if n := len(f.m); n > maxFingerprints {
			t.Fatalf("after %d leases, %d remembered, want at most %d", i+1, n, maxFingerprints)
		}
	}
	last := leaseKey{"k", engine.Token(maxFingerprints + 9)}
	if facts, ok := f.take(last); !ok || facts.fingerprint != "fp" {
		t.Errorf("take(the last lease) = %+v, %v; want %q, true", facts, ok, "fp")
	}
	if _, ok := f.take(last); ok {
		t.Error("second take of a lease found it, want it forgotten")
	}
}

// The fingerprint a Store remembers is a hint: when it is not the record's,
// the completed record holds the record's all the same.
func TestCompleteWithAWrongHint(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(servicetest.RedisURL(t))
	if err != nil {
		t.Fatalf("%s is not a Redis URL", servicetest.EnvRedisURL)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	s, err := New(c, WithPrefix("idempotency-test:hint:"+time.Now().Format(time.RFC3339Nano)+":"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, hint := range []string{"", "fp-other", "fp-longer-than-the-record's", "f"} {
		id := engine.ID{Key: hint}
		cl, err := s.Claim(ctx, id, "fp-right", time.Minute, time.Minute)
		if err != nil || cl.Status != engine.Acquired {
			t.Fatalf("Claim = %v, %v; want acquired", cl.Status, err)
		}
		key := s.RecordKey(id)
		t.Cleanup(func() { c.Del(context.Background(), key) })
		s.(*store).fps.put(leaseKey{key, cl.Token}, leaseFacts{fingerprint: hint, abandoned: 3, created: 1})
		want := &engine.Response{Status: http.StatusCreated, Body: []byte("body")}
		if err := s.Complete(ctx, id, cl.Token, want, time.Minute); err != nil {
			t.Fatalf("Complete with the hint %q error = %v", hint, err)
		}
		got, err := s.Claim(ctx, id, "x", time.Minute, time.Minute)
		if err != nil || got.Status != engine.Completed || got.Fingerprint != "fp-right" || string(got.Response.Body) != "body" {
			t.Errorf("with the hint %q, Claim = %+v, %v; want completed %q with the body", hint, got, err, "fp-right")
		}
		// The record's own facts, not the wrong hint's.
		if r, err := s.Lookup(ctx, id); err != nil || r.Abandoned != 0 || r.Created.UnixMilli() == 1 {
			t.Errorf("with the hint %q, Lookup = %+v, %v; want the record's abandoned count and time", hint, r, err)
		}
	}
}
