package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

// The functions read the records' headers themselves: whatever a record
// holds, every operation answers with a result, ErrLeaseLost or
// ErrCorruptRecord, never with a script error. Checked on every prefix of
// every sample record and on changes to each byte of its header.
func TestDamagedRecordsThroughFunctions(t *testing.T) {
	t.Parallel()
	opt, err := redis.ParseURL(servicetest.RedisURL(t))
	if err != nil {
		t.Fatalf("%s is not a Redis URL", servicetest.EnvRedisURL)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	s, err := New(c, WithPrefix("idempotency-test:damaged:"+strconv.FormatInt(time.Now().UnixNano(), 36)+":"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := engine.ID{Key: "damaged"}
	key := s.RecordKey(id)
	t.Cleanup(func() { c.Del(context.Background(), key, StepsKey(s, id)) })

	var damaged []string
	for _, r := range sampleRecords() {
		rec := string(mustEncode(t, r))
		for n := range min(len(rec), 64) {
			damaged = append(damaged, rec[:n])
		}
		for i := range min(len(rec), recordHeader) {
			for _, b := range []byte{0, 1, 2, 3, 0xff} {
				d := []byte(rec)
				d[i] = b
				damaged = append(damaged, string(d))
			}
		}
	}
	seen := map[string]int{}
	check := func(op, value string, err error) {
		t.Helper()
		switch {
		case err == nil:
			seen["nil"]++
		case errors.Is(err, engine.ErrLeaseLost):
			seen["ErrLeaseLost"]++
		case errors.Is(err, ErrCorruptRecord):
			seen["ErrCorruptRecord"]++
		case errors.Is(err, engine.ErrNotFound) && (op == "Lookup" || strings.HasPrefix(op, "Resolve")):
			seen["ErrNotFound"]++
		default:
			t.Fatalf("%s on %q error = %v, want nil, ErrLeaseLost, ErrNotFound or ErrCorruptRecord", op, value, err)
		}
	}
	for _, value := range damaged {
		token := engine.Token(1)
		if len(value) >= 10 {
			token = engine.Token(binary.BigEndian.Uint64([]byte(value[2:10])))
		}
		for _, op := range []struct {
			name string
			call func() error
		}{
			{"Claim", func() error { _, err := s.Claim(ctx, id, "fp", time.Minute, time.Minute); return err }},
			{"Complete", func() error { return s.Complete(ctx, id, token, &engine.Response{Status: http.StatusOK}, time.Minute) }},
			{"Release", func() error { return s.Release(ctx, id, token) }},
			{"Extend", func() error { return s.Extend(ctx, id, token, time.Minute) }},
			{"Lookup", func() error { _, err := s.Lookup(ctx, id); return err }},
			{"Resolve", func() error { return s.Resolve(ctx, id, &engine.Response{Status: http.StatusOK}, time.Minute) }},
			{"Resolve(nil)", func() error { return s.Resolve(ctx, id, nil, time.Minute) }},
			{"SaveStep", func() error {
				return s.SaveStep(ctx, id, token, engine.Step{Name: "a", Fingerprint: "fp", Done: true, Result: []byte("1")})
			}},
			{"SaveStep (remove)", func() error { return s.SaveStep(ctx, id, token, engine.Step{Name: "a"}) }},
		} {
			if err := c.Set(ctx, key, value, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			check(op.name, value, op.call())
		}
	}
	// The damage reached every kind of answer.
	for _, answer := range []string{"nil", "ErrLeaseLost", "ErrNotFound", "ErrCorruptRecord"} {
		if seen[answer] == 0 {
			t.Errorf("no operation answered %s: %v", answer, seen)
		}
	}
	t.Logf("%d damaged records, answers: %v", len(damaged), seen)
}
