package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// version1 builds a record in the previous layout (version 1), as earlier
// releases wrote it: the end of the lease in µs by the server's clock, the
// nonce after it, then the fingerprint and the encoded response.
func version1(state byte, token engine.Token, leaseEnd int64, fp string, response []byte) string {
	b := []byte{1, state}
	b = binary.BigEndian.AppendUint64(b, uint64(token))
	b = binary.BigEndian.AppendUint64(b, uint64(leaseEnd))
	b = append(b, "nonce-v1"...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(fp)))
	b = append(b, fp...)
	return string(append(b, response...))
}

// version1Response is a response as version 1 encoded it, its header names
// in no particular order: 201, Location: /orders/1, Content-Type:
// application/json, {"id":1}.
func version1Response() ([]byte, *engine.Response) {
	body := `{"id":1}`
	b := []byte{0, 201, 0, 0, 0, 0, byte(len(body))}
	b = append(b, 2, 2) // names, values
	for _, h := range [][2]string{{"Location", "/orders/1"}, {"Content-Type", "application/json"}} {
		b = append(b, byte(len(h[0])))
		b = append(b, h[0]...)
		b = append(b, 1, byte(len(h[1])))
		b = append(b, h[1]...)
	}
	return append(b, body...), &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/orders/1"}, "Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}

// Records written by the previous release stay readable: a completed one is
// replayed, an in-flight one is in flight until its lease ends by the
// server's clock and is then taken over with a larger token, a released one
// passes its token on. Complete, Release and Extend answer lease lost on
// them: only the previous release can hold their leases.
func TestVersion1Records(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// A token ahead of every clock, so that the next one can only be larger
	// by coming from it.
	ahead := engine.Token(now.Add(time.Hour).UnixMicro())
	encoded, want := version1Response()
	write := func(name, value string) engine.ID {
		t.Helper()
		id := engine.ID{Scope: "version-1", Key: name}
		if err := c.Set(ctx, s.RecordKey(id), value, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		return id
	}
	lost := func(id engine.ID, token engine.Token) {
		t.Helper()
		for op, err := range map[string]error{
			"Extend":   s.Extend(ctx, id, token, time.Minute),
			"Release":  s.Release(ctx, id, token),
			"Complete": s.Complete(ctx, id, token, &engine.Response{Status: http.StatusOK}, time.Hour),
		} {
			if !errors.Is(err, engine.ErrLeaseLost) {
				t.Errorf("%s of a version 1 record error = %v, want ErrLeaseLost", op, err)
			}
		}
	}

	t.Run("completed", func(t *testing.T) {
		id := write("completed", version1(2, ahead, 0, "fp-1", encoded))
		got, err := s.Claim(ctx, id, "fp-2", time.Minute, time.Hour)
		if err != nil || got.Status != engine.Completed || got.Fingerprint != "fp-1" {
			t.Fatalf("Claim = %v %q, %v; want completed %q", got.Status, got.Fingerprint, err, "fp-1")
		}
		if got.Response.Status != want.Status || string(got.Response.Body) != string(want.Body) ||
			len(got.Response.Header) != 2 || http.Header(got.Response.Header).Get("Location") != "/orders/1" ||
			http.Header(got.Response.Header).Get("Content-Type") != "application/json" {
			t.Errorf("replayed %+v, want %+v", got.Response, want)
		}
		lost(id, ahead)
	})
	t.Run("in flight", func(t *testing.T) {
		id := write("in-flight", version1(1, ahead, now.Add(time.Minute).UnixMicro(), "fp-1", nil))
		for _, fp := range []string{"fp-1", "fp-2"} {
			got, err := s.Claim(ctx, id, fp, time.Minute, time.Hour)
			if err != nil || got.Status != engine.InFlight || got.Fingerprint != "fp-1" {
				t.Fatalf("Claim(%q) = %v %q, %v; want in flight %q", fp, got.Status, got.Fingerprint, err, "fp-1")
			}
			if got.RetryAfter < 50*time.Second || got.RetryAfter > time.Minute {
				t.Errorf("Claim(%q) RetryAfter = %v, want about a minute", fp, got.RetryAfter)
			}
		}
		lost(id, ahead)
	})
	t.Run("lease expired", func(t *testing.T) {
		id := write("expired", version1(1, ahead, now.Add(-time.Second).UnixMicro(), "fp-1", nil))
		got, err := s.Claim(ctx, id, "fp-2", time.Minute, time.Hour)
		if err != nil || got.Status != engine.InFlight || got.Fingerprint != "fp-1" || got.RetryAfter != 0 {
			t.Fatalf("Claim with another fingerprint = %+v, %v; want in flight %q, RetryAfter 0", got, err, "fp-1")
		}
		got, err = s.Claim(ctx, id, "fp-1", time.Minute, time.Hour)
		if err != nil || got.Status != engine.Acquired || got.Token != ahead+1 {
			t.Fatalf("Claim = %v %d, %v; want acquired with %d", got.Status, got.Token, err, ahead+1)
		}
		if v, err := c.GetRange(ctx, s.RecordKey(id), 0, 0).Result(); err != nil || v != "\x03" {
			t.Errorf("taken over record's version = %q, %v; want 3", v, err)
		}
		if got.Abandoned != 1 {
			t.Errorf("takeover of a version 1 lease: Abandoned = %d, want 1", got.Abandoned)
		}
		if err := s.Complete(ctx, id, got.Token, want, time.Hour); err != nil {
			t.Fatalf("Complete error = %v", err)
		}
	})
	t.Run("released", func(t *testing.T) {
		id := write("released", version1(3, ahead, 0, "", nil))
		lost(id, ahead)
		got, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		if err != nil || got.Status != engine.Acquired || got.Token != ahead+1 {
			t.Fatalf("Claim = %v %d, %v; want acquired with %d", got.Status, got.Token, err, ahead+1)
		}
	})
}

// version2 builds a record in the layout of the release before this one
// (version 2): a header of 30 bytes, with the lease's slack, and no
// abandoned count or time.
func version2(state byte, token engine.Token, slack int64, fp string, response []byte) string {
	b := []byte{2, state}
	b = binary.BigEndian.AppendUint64(b, uint64(token))
	b = append(b, "nonce-v2"...)
	b = binary.BigEndian.AppendUint64(b, uint64(slack))
	b = binary.BigEndian.AppendUint32(b, uint32(len(fp)))
	b = append(b, fp...)
	return string(append(b, response...))
}

// Version 2 records, which the previous release wrote, stay readable: a
// completed one is replayed and looked up, an in-flight one whose lease
// ended is taken over into version 3 with one abandoned holder, a released
// one passes its token on.
func TestVersion2Records(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := sharedStore(t)
	// Ahead of every clock, and exact in Lua's numbers (below 2^53).
	const ahead = engine.Token(1 << 52)
	write := func(name, value string, ttl time.Duration) engine.ID {
		t.Helper()
		id := engine.ID{Scope: "version-2", Key: name}
		if err := c.Set(ctx, s.RecordKey(id), value, ttl).Err(); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// 201, Location: /orders/1, {"id":1}: one header, so in order.
	body := `{"id":1}`
	encoded := append([]byte{0, 201, 0, 0, 0, 0, byte(len(body)), 1, 1, 8}, "Location"...)
	encoded = append(append(encoded, 1, 9), "/orders/1"...)
	encoded = append(encoded, body...)
	want := &engine.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte(body)}

	id := write("completed", version2(2, ahead, 0, "fp-2", encoded), time.Hour)
	got, err := s.Claim(ctx, id, "fp-2", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Completed || string(got.Response.Body) != string(want.Body) {
		t.Errorf("Claim of a completed version 2 record = %+v, %v; want the replay", got, err)
	}
	if r, err := s.Lookup(ctx, id); err != nil || !r.Completed || r.Fingerprint != "fp-2" || !r.Created.IsZero() {
		t.Errorf("Lookup of a completed version 2 record = %+v, %v; want completed, no Created", r, err)
	}

	// In flight, its lease over: the record outlives it by an hour.
	id = write("expired", version2(1, ahead, int64(time.Hour/time.Millisecond), "fp-2", nil), time.Hour)
	got, err = s.Claim(ctx, id, "fp-2", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Acquired || got.Token != ahead+1 || got.Abandoned != 1 {
		t.Fatalf("Claim = %+v, %v; want acquired with %d, Abandoned 1", got, err, ahead+1)
	}
	if v, err := c.GetRange(ctx, s.RecordKey(id), 0, 0).Result(); err != nil || v != "\x03" {
		t.Errorf("taken over record's version = %q, %v; want 3", v, err)
	}
	if err := s.Complete(ctx, id, got.Token, want, time.Hour); err != nil {
		t.Errorf("Complete after the takeover error = %v", err)
	}

	id = write("released", version2(3, ahead, 0, "", nil), time.Hour)
	got, err = s.Claim(ctx, id, "fp-2", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Acquired || got.Token != ahead+1 || got.Abandoned != 0 {
		t.Errorf("Claim of a released version 2 record = %+v, %v; want acquired with %d, Abandoned 0", got, err, ahead+1)
	}
}
