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
	res := run(t, runConfig{n: *flagMessages, fates: ordinary, newProcess: noDoor})
	t.Logf("without the door: %v", res)
	if res.total() <= res.published {
		t.Errorf("effects = %d, want more than the %d messages (deaths before ack: %d)",
			res.total(), res.published, res.deaths[dieBeforeAck])
	}
}
