package e2e_test

import (
	"flag"
	"testing"
)

// The fault runs are short by default, to fit in CI; -faultrun.long runs
// them at the size RELIABILITY.md reports. Every fault they inject is drawn
// from -faultrun.seed.
var (
	long = flag.Bool("faultrun.long", false, "run the fault runs at full size (minutes)")
	seed = flag.Uint64("faultrun.seed", 1, "seed of the fault runs' random choices")
)

// size returns short, or full with -faultrun.long.
func size[T any](short, full T) T {
	if *long {
		return full
	}
	return short
}

// logSeed says which seed a run used, so that it can be run again.
func logSeed(t *testing.T) {
	t.Helper()
	t.Logf("seed %d (-faultrun.seed=%d to repeat; -faultrun.long=%v)", *seed, *seed, *long)
}
