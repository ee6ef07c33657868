//go:build oncelanded

package consume_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/server"
)

// onceDoor makes processes that run the effect through once.Do on their own
// Runner, over store: a process that dies leaves its record as it was.
func onceDoor(store server.Store, opts ...once.Option) func(consume.Func) (process, error) {
	return func(effect consume.Func) (process, error) {
		cut := &cutStore{inner: store}
		r, err := once.New(cut, append([]once.Option{
			once.WithLease(lease),
			once.WithTTL(10 * time.Minute),
			once.WithStoreTimeout(5 * time.Second),
		}, opts...)...)
		if err != nil {
			return process{}, err
		}
		return process{
			run: consume.Once(r, effect),
			die: cut.kill,
			stop: func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = r.Shutdown(ctx)
			},
		}, nil
	}
}

// TestExactlyOnce publishes messages whose deliveries fail, die before the
// effect, die after the door returned but before the ack, or outlast
// AckWait, and checks that each message's effect ran exactly once, on each
// store. TestWithoutDoor is the same run without the door.
func TestExactlyOnce(t *testing.T) {
	for _, k := range teststores.All() {
		t.Run(k.Name, func(t *testing.T) {
			res := run(t, runConfig{n: *flagMessages, fates: ordinary, newProcess: onceDoor(k.New(t))})
			t.Logf("%s, with the door: %v", k.Name, res)
			if bad := res.notOnce(); len(bad) > 0 {
				t.Errorf("effects not run exactly once (message:effects): %v", bad)
			}
			if len(res.terms) > 0 {
				t.Errorf("terminated: %v, want none", res.terms)
			}
		})
	}
}

// TestDeathInsideEffect measures the death the door cannot cover alone: a
// process that dies after the effect and before Do stored it. The takeover
// of its record says so (Abandoned > 0); what follows depends on who acts on
// that.
func TestDeathInsideEffect(t *testing.T) {
	for _, k := range teststores.All() {
		t.Run(k.Name, func(t *testing.T) {
			t.Run("rerun", func(t *testing.T) {
				// The effect ignores Abandoned: every death after the
				// effect runs it once more.
				res := run(t, runConfig{n: *flagMessages, fates: inside, newProcess: onceDoor(k.New(t))})
				t.Logf("%s, RerunAbandoned, effect unaware: %v", k.Name, res)
				if got, want := res.total(), res.published+res.deaths[dieAfterEffect]; got != want {
					t.Errorf("effects = %d, want %d messages + %d deaths after the effect", got, res.published, res.deaths[dieAfterEffect])
				}
				if got, want := res.abandoned, res.deaths[dieBefore]+res.deaths[dieAfterEffect]; got != want {
					t.Errorf("takeovers with Abandoned > 0 = %d, want the %d deaths inside the function", got, want)
				}
			})
			t.Run("own check", func(t *testing.T) {
				// The effect looks for its own effect when Abandoned > 0.
				res := run(t, runConfig{n: *flagMessages, fates: inside, newProcess: onceDoor(k.New(t)), checkOwn: true})
				t.Logf("%s, RerunAbandoned, effect checks itself on takeover: %v", k.Name, res)
				if bad := res.notOnce(); len(bad) > 0 {
					t.Errorf("effects not run exactly once (message:effects): %v", bad)
				}
			})
			t.Run("refuse", func(t *testing.T) {
				// The door refuses to guess: a message whose holder was
				// lost is terminated as of unknown outcome, whether or not
				// its effect ran.
				res := run(t, runConfig{n: *flagMessages, fates: inside,
					newProcess: onceDoor(k.New(t), once.WithAbandoned(engine.RefuseAbandoned))})
				t.Logf("%s, RefuseAbandoned: %v", k.Name, res)
				lost := 0
				for i := range res.published {
					id := msgID(i)
					c := res.effects[id]
					reason, termed := res.terms[id]
					switch {
					case c > 1:
						t.Errorf("%s: effects = %d, want at most 1", id, c)
					case termed && !strings.Contains(reason, "unknown"):
						t.Errorf("%s: terminated for %q, want an unknown outcome", id, reason)
					case c == 0 && !termed:
						t.Errorf("%s: no effect and not terminated", id)
					case c == 0:
						lost++
					}
				}
				t.Logf("%s, RefuseAbandoned: %d messages terminated as unknown, %d of them without their effect", k.Name, len(res.terms), lost)
			})
		})
	}
}
