package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// A master of a Cluster stops answering (SIGSTOP: it hangs, as a frozen
// machine does), and the Cluster promotes its replica. Through clients with
// and without ContextTimeoutEnabled, each with and without WithReplicaAck:
// every call ends by its deadline while the master hangs (Check too, with
// an error), claims succeed again once the replica serves the master's
// slots, and a record that a replica acknowledged before the failover is
// replayed after it, not run again.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	began := time.Now()
	nodes := startClusterNodes(t, 1, time.Second)
	t.Logf("cluster up after %v", time.Since(began))
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	ctx := context.Background()
	// Every master has its replica in step: WAIT 1 answers 1.
	var masters []*redisProcess
	for _, n := range nodes {
		addr := n.Addr
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		role, err := c.Do(ctx, "ROLE").Slice()
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		if role[0] == "master" {
			masters = append(masters, n)
			for deadline := time.Now().Add(30 * time.Second); ; {
				acks, err := c.Do(ctx, "WAIT", 1, 100).Int()
				if err == nil && acks == 1 {
					break
				}
				if time.Now().After(deadline) {
					c.Close()
					t.Fatalf("master %s: WAIT 1 = %d, %v; want its replica", addr, acks, err)
				}
			}
		}
		c.Close()
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}

	type variant struct {
		name  string
		store redisstore.Store
		acked bool
	}
	var variants []variant
	for _, timeouts := range []bool{true, false} {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: timeouts})
		t.Cleanup(func() { c.Close() })
		for _, acked := range []bool{false, true} {
			name := fmt.Sprintf("ContextTimeoutEnabled=%v,WithReplicaAck=%v", timeouts, acked)
			var opts []redisstore.Option
			if acked {
				opts = append(opts, redisstore.WithReplicaAck(1, time.Second))
			}
			s, err := redisstore.New(c, append(opts, redisstore.WithPrefix(name+":"))...)
			if err != nil {
				t.Fatal(err)
			}
			variants = append(variants, variant{name, s, acked})
		}
	}
	const keys = 48 // on every master
	for _, v := range variants {
		for i := range keys {
			id := engine.ID{Scope: "s", Key: fmt.Sprint("before-", i)}
			cl, err := v.store.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil || cl.Status != engine.Acquired {
				t.Fatalf("%s: Claim(%v) = %v, %v; want acquired", v.name, id, cl.Status, err)
			}
			if err := v.store.Complete(ctx, id, cl.Token, &engine.Response{Status: 201}, time.Hour); err != nil {
				t.Fatalf("%s: Complete(%v) error = %v", v.name, id, err)
			}
		}
	}

	t.Logf("records written after %v", time.Since(began))
	victim := masters[0]
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Cleanup kills it: SIGKILL ends a stopped process too.

	const callDeadline = 300 * time.Millisecond
	// Check asks every master, the hung one too: it fails, by its deadline.
	for _, v := range variants {
		err := withDeadline(t, v.name, callDeadline, v.store.Check)
		if err == nil {
			t.Errorf("%s: Check with a master that hangs = nil, want an error", v.name)
		}
	}
	var wg sync.WaitGroup
	for _, v := range variants {
		wg.Go(func() {
			giveUp := time.Now().Add(45 * time.Second)
			for pass := 0; ; pass++ {
				failed, unreplicated, ran := 0, 0, 0
				var last error
				for i := range keys {
					old := engine.ID{Scope: "s", Key: fmt.Sprint("before-", i)}
					err := withDeadline(t, v.name, callDeadline, func(ctx context.Context) error {
						cl, err := v.store.Claim(ctx, old, "fp", time.Minute, time.Hour)
						if err == nil && v.acked && cl.Status != engine.Completed {
							t.Errorf("%s: Claim(%v) after the failover = %v, want the completed record that a replica acknowledged", v.name, old, cl.Status)
						}
						return err
					})
					if err != nil {
						// Most likely the hung master: the next pass
						// tries again from the first key.
						failed, last = failed+1, err
						break
					}
					fresh := engine.ID{Scope: "s", Key: fmt.Sprintf("after-%d-%d", i, pass)}
					err = withDeadline(t, v.name, callDeadline, func(ctx context.Context) error {
						cl, err := v.store.Claim(ctx, fresh, "fp", time.Minute, time.Hour)
						if err != nil {
							return err
						}
						if cl.Status != engine.Acquired {
							return fmt.Errorf("Claim(%v) of a new key = %v, want acquired", fresh, cl.Status)
						}
						return v.store.Complete(ctx, fresh, cl.Token, &engine.Response{Status: 201}, time.Hour)
					})
					switch {
					case err == nil:
						ran++
					case v.acked && errors.Is(err, redisstore.ErrNotReplicated):
						// The promoted replica has no replica of its own:
						// WithReplicaAck refuses to claim there.
						unreplicated++
					default:
						failed, last = failed+1, err
					}
					if failed > 0 {
						break
					}
				}
				if failed == 0 && ran > 0 {
					t.Logf("%s: over after %v, pass %d", v.name, time.Since(began), pass)
					if v.acked && unreplicated == 0 {
						t.Errorf("%s: every new key was claimed, want the promoted master's refused (it has no replica)", v.name)
					}
					return
				}
				// A node that refuses at once fails a pass at once: a pass
				// every 20 ms at most.
				<-time.After(20 * time.Millisecond)
				if time.Now().After(giveUp) {
					t.Errorf("%s: on pass %d, a call failed (%v) after %d new keys were claimed, %d refused unreplicated; want every failure over",
						v.name, pass, last, ran, unreplicated)
					return
				}
			}
		})
	}
	wg.Wait()
}

// withDeadline calls f with a context that ends after deadline, and reports
// a call that outlasts it by more than a second: a hung node must cost no
// more than the call's deadline.
func withDeadline(t *testing.T, name string, deadline time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	if took := time.Since(start); took > deadline+time.Second {
		t.Errorf("%s: a call took %v, past its deadline, %v (error %v)", name, took, deadline, err)
	}
	return err
}
