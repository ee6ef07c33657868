package consume_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// ordinary are the fates of the runs that the door must make exactly once:
// transient failures, deaths before the effect and after the door returned,
// and effects slower than AckWait.
var ordinary = fates{failBefore: 0.08, dieBefore: 0.08, dieBeforeAck: 0.12, slow: 0.03}

// TestWithoutDoor is the run of TestExactlyOnce with the effect called
// directly: every death after the effect, and every redelivery during a slow
// effect, runs it again.
func TestWithoutDoor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fates fates
	}{
		{"ordinary", ordinary},
		{"inside", inside},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, runConfig{n: *flagMessages, fates: tc.fates, newProcess: noDoor})
			t.Logf("without the door, %s fates: %v", tc.name, res)
			// Every death after the effect runs it again.
			if got, min := res.total(), res.published+res.deaths[dieBeforeAck]+res.deaths[dieAfterEffect]; got < min {
				t.Errorf("effects = %d, want at least %d", got, min)
			}
			if res.total() <= res.published {
				t.Errorf("effects = %d, want more than the %d messages", res.total(), res.published)
			}
		})
	}
}

// inside are the fates of the runs where processes die inside the door's
// function: before the effect (which the door covers) and after it, before
// the door could store its result (which no door can tell apart).
var inside = fates{dieBefore: 0.06, dieAfterEffect: 0.12}

// door makes the processes of a run with the door over store; refuse asks
// for RefuseAbandoned.
type door func(store engine.Store, refuse bool) func(consume.Func) (process, error)

// testExactlyOnce publishes messages whose deliveries fail, die before the
// effect, die after the door returned but before the ack, or outlast
// AckWait, and checks that each message's effect ran exactly once, on each
// store. TestWithoutDoor is the same run without the door.
func testExactlyOnce(t *testing.T, d door) {
	for _, k := range teststores.All() {
		t.Run(k.Name, func(t *testing.T) {
			res := run(t, runConfig{n: *flagMessages, fates: ordinary, newProcess: d(k.New(t), false)})
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

// testDeathInsideEffect measures the death the door cannot cover alone: a
// process that dies after the effect and before the door stored its result.
// The takeover of its record says so (Abandoned > 0); what follows depends
// on who acts on that.
func testDeathInsideEffect(t *testing.T, d door) {
	for _, k := range teststores.All() {
		t.Run(k.Name, func(t *testing.T) {
			t.Run("rerun", func(t *testing.T) {
				// The effect ignores Abandoned: every death after the
				// effect runs it once more.
				res := run(t, runConfig{n: *flagMessages, fates: inside, newProcess: d(k.New(t), false)})
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
				res := run(t, runConfig{n: *flagMessages, fates: inside, newProcess: d(k.New(t), false), checkOwn: true})
				t.Logf("%s, RerunAbandoned, effect checks itself on takeover: %v", k.Name, res)
				if bad := res.notOnce(); len(bad) > 0 {
					t.Errorf("effects not run exactly once (message:effects): %v", bad)
				}
			})
			t.Run("refuse", func(t *testing.T) {
				// The door refuses to guess: a message whose holder was
				// lost is terminated as of unknown outcome, whether or not
				// its effect ran.
				res := run(t, runConfig{n: *flagMessages, fates: inside, newProcess: d(k.New(t), true)})
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
				t.Logf("%s, RefuseAbandoned: %d messages terminated as of unknown outcome, %d of them without their effect",
					k.Name, len(res.terms), lost)
			})
		})
	}
}
