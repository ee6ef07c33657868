package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

const outagePassword = "s3cret-outage-password"

// outageStore starts a Redis of the test's own, with a password, and returns
// a Store on it that has claimed one key, through a client with the
// ContextTimeoutEnabled and the read and write timeouts given (0: go-redis's
// default).
func outageStore(t *testing.T, contextTimeout bool, timeout time.Duration) (*redisProcess, redisstore.Store) {
	return outageStoreOn(t, contextTimeout, timeout, false, nil)
}

// outageStoreOn is outageStore, through a Ring of one shard when ring is
// set, whose connections record in w.
func outageStoreOn(t *testing.T, contextTimeout bool, timeout time.Duration, ring bool, w *callerWrites) (*redisProcess, redisstore.Store) {
	t.Helper()
	needRedisServer(t)
	p := startRedis(t, "--requirepass", outagePassword)
	var c redis.UniversalClient = redis.NewClient(&redis.Options{
		Addr: p.Addr, Password: outagePassword, ContextTimeoutEnabled: contextTimeout,
		ReadTimeout: timeout, WriteTimeout: timeout,
	})
	if ring {
		c.Close()
		c = redis.NewRing(&redis.RingOptions{
			Addrs: map[string]string{"one": p.Addr}, Password: outagePassword,
			ContextTimeoutEnabled: contextTimeout, ReadTimeout: timeout, WriteTimeout: timeout,
			Dialer: w.dialer(),
		})
	}
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(context.Background(), engine.ID{Key: "before"}, "fp", time.Minute, time.Hour); err != nil {
		t.Fatalf("Claim while Redis is up error = %v", err)
	}
	return p, s
}

// checkOutageError checks that a call made while Redis is unusable failed
// as a store error, by its context's deadline, without the password.
func checkOutageError(t *testing.T, op string, err error, took, deadline time.Duration) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s while Redis is down error = nil, want a store error", op)
	}
	if errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("%s error = %v, want a store error, not ErrLeaseLost", op, err)
	}
	if !strings.HasPrefix(err.Error(), "redisstore: ") {
		t.Errorf("%s error = %q, want the prefix %q", op, err, "redisstore: ")
	}
	if strings.Contains(err.Error(), outagePassword) {
		t.Errorf("%s error = %q holds the password", op, err)
	}
	// The deadline, and a margin for a loaded machine running -race.
	if took > deadline+500*time.Millisecond {
		t.Errorf("%s took %v to fail, want about its deadline, %v", op, took, deadline)
	}
}

// A Redis that is down fails every operation with a store error, by the
// context's deadline at the latest. (How soon before it is the client's
// configuration: with go-redis's defaults, dial retries and command retries
// give up after about two seconds.)
func TestRedisDown(t *testing.T) {
	t.Parallel()
	p, s := outageStore(t, true, 0)
	p.Kill()
	const deadline = time.Second
	for op, call := range map[string]func(context.Context) error{
		"Claim": func(ctx context.Context) error {
			_, err := s.Claim(ctx, engine.ID{Key: "during"}, "fp", time.Minute, time.Hour)
			return err
		},
		"Complete": func(ctx context.Context) error {
			return s.Complete(ctx, engine.ID{Key: "before"}, 1, &engine.Response{Status: 200}, time.Hour)
		},
		"Release": func(ctx context.Context) error { return s.Release(ctx, engine.ID{Key: "before"}, 1) },
		"Extend":  func(ctx context.Context) error { return s.Extend(ctx, engine.ID{Key: "before"}, 1, time.Minute) },
	} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := call(ctx)
			checkOutageError(t, op, err, time.Since(start), deadline)
		})
	}
}

// A Redis that hangs (stopped, or cut off by a partition) fails a call by its
// context's deadline, whether the client (a Client, or a Ring) has
// ContextTimeoutEnabled or not (then go-redis would wait for its own
// ReadTimeout, 5 s by default, or for ever with none, and the Store does
// not).
func TestRedisHung(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		contextTimeout bool
		timeout        time.Duration
		ring           bool
	}{{true, 0, false}, {false, 0, false}, {false, -2, false}, {true, 0, true}, {false, 0, true}, {false, -2, true}} {
		t.Run(fmt.Sprintf("ring=%v,ContextTimeoutEnabled=%v,timeouts=%v", tc.ring, tc.contextTimeout, tc.timeout), func(t *testing.T) {
			t.Parallel()
			// The Ring's commands are all sent from the test's goroutine:
			// none is left waiting on a goroutine of its own once the call
			// has failed.
			w := &callerWrites{caller: []byte("TestRedisHung")}
			p, s := outageStoreOn(t, tc.contextTimeout, tc.timeout, tc.ring, w)
			if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// Killing a stopped process works: Kill, in the cleanup, is enough.
			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			_, err := s.Claim(ctx, engine.ID{Key: "during"}, "fp", time.Minute, time.Hour)
			checkOutageError(t, "Claim", err, time.Since(start), deadline)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Claim error = %v, want context.DeadlineExceeded", err)
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.away) > 0 {
				t.Errorf("%q sent from a goroutine other than the caller's, want none", w.away)
			}
		})
	}
}

// The server closes every connection of the Store's client (CLIENT KILL,
// as a Redis timeout, a proxy or a load balancer closes idle ones): the
// next calls succeed, on new connections, through every kind of client.
func TestConnectionsKilled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		contextTimeout bool
		ring           bool
	}{{true, false}, {false, false}, {true, true}, {false, true}} {
		t.Run(fmt.Sprintf("ring=%v,ContextTimeoutEnabled=%v", tc.ring, tc.contextTimeout), func(t *testing.T) {
			t.Parallel()
			p, s := outageStoreOn(t, tc.contextTimeout, 0, tc.ring, nil)
			admin := redis.NewClient(&redis.Options{Addr: p.Addr, Password: outagePassword, ContextTimeoutEnabled: true})
			t.Cleanup(func() { admin.Close() })
			ctx := context.Background()
			for round := range 3 {
				killed, err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Int()
				if err != nil || killed == 0 {
					t.Fatalf("round %d: CLIENT KILL = %d, %v; want the Store's connections killed", round, killed, err)
				}
				id := engine.ID{Key: fmt.Sprint("after-", round)}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				cl, err := s.Claim(cctx, id, "fp", time.Minute, time.Hour)
				if err != nil || cl.Status != engine.Acquired {
					cancel()
					t.Fatalf("round %d: Claim after the kill = %v, %v; want acquired", round, cl.Status, err)
				}
				if err := s.Complete(cctx, id, cl.Token, &engine.Response{Status: 201}, time.Hour); err != nil {
					t.Errorf("round %d: Complete error = %v", round, err)
				}
				if cl, err := s.Claim(cctx, id, "fp", time.Minute, time.Hour); err != nil || cl.Status != engine.Completed {
					t.Errorf("round %d: replay = %v, %v; want completed", round, cl.Status, err)
				}
				cancel()
			}
		})
	}
}
