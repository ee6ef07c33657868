package consume_test

import (
	"testing"
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
