package engine

import (
	"testing"
	"time"
)

// TestBackoffNext: the waits double from the first to the longest; without
// clip, a wait that would not end before the deadline is not taken; with
// clip, the last one is cut short to end at the deadline.
func TestBackoffNext(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	type step struct {
		at   time.Duration // since t0
		want time.Duration
		ok   bool
	}
	for _, tc := range []struct {
		name           string
		first, longest time.Duration
		deadline       time.Duration // since t0
		clip           bool
		steps          []step
	}{
		{"doubles up to the longest", 5 * ms, 20 * ms, time.Hour, false,
			[]step{{0, 5 * ms, true}, {0, 10 * ms, true}, {0, 20 * ms, true}, {0, 20 * ms, true}}},
		{"a wait must end before the deadline", 10 * ms, 40 * ms, 100 * ms, false,
			[]step{{0, 10 * ms, true}, {70 * ms, 20 * ms, true}, {60 * ms, 0, false}}},
		{"a wait ending at the deadline is not taken", 10 * ms, 10 * ms, 100 * ms, false,
			[]step{{90 * ms, 0, false}, {89 * ms, 10 * ms, true}}},
		{"clip cuts the last wait to the deadline", 10 * ms, 250 * ms, 25 * ms, true,
			[]step{{0, 10 * ms, true}, {10 * ms, 15 * ms, true}, {25 * ms, 0, false}}},
		{"clip takes no wait past the deadline", 10 * ms, 250 * ms, 25 * ms, true,
			[]step{{30 * ms, 0, false}}},
		{"a refused wait does not double", 10 * ms, 80 * ms, 15 * ms, false,
			[]step{{10 * ms, 0, false}, {0, 10 * ms, true}, {0, 0, false}}},
		{"the longest bounds the first", 50 * ms, 20 * ms, time.Hour, false,
			[]step{{0, 50 * ms, true}, {0, 20 * ms, true}, {0, 20 * ms, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackoff(tc.first, tc.longest, t0.Add(tc.deadline), tc.clip)
			for i, s := range tc.steps {
				got, ok := b.next(t0.Add(s.at))
				if got != s.want || ok != s.ok {
					t.Fatalf("next #%d at %v = %v, %v; want %v, %v", i+1, s.at, got, ok, s.want, s.ok)
				}
			}
		})
	}
}

// TestBackoffWait: wait sleeps the next wait and reports a try may follow;
// it reports false at once when the deadline leaves no room, or when done
// is closed; its timer is reused and released by stop.
func TestBackoffWait(t *testing.T) {
	t.Run("sleeps", func(t *testing.T) {
		b := newBackoff(time.Millisecond, 2*time.Millisecond, time.Now().Add(time.Hour), false)
		defer b.stop()
		start := time.Now()
		for i := range 3 {
			if !b.wait(nil) {
				t.Fatalf("wait #%d = false an hour before the deadline", i+1)
			}
		}
		if took := time.Since(start); took < 5*time.Millisecond {
			t.Errorf("three waits of 1, 2 and 2ms took %v", took)
		}
		if b.timer == nil {
			t.Error("no timer after waiting")
		}
	})
	t.Run("deadline passed", func(t *testing.T) {
		b := newBackoff(time.Hour, time.Hour, time.Now().Add(time.Minute), false)
		defer b.stop()
		if b.wait(nil) {
			t.Fatal("wait = true for a wait that ends after the deadline")
		}
		if b.timer != nil {
			t.Error("a refused wait made a timer")
		}
	})
	t.Run("done", func(t *testing.T) {
		b := newBackoff(time.Hour, time.Hour, time.Now().Add(2*time.Hour), false)
		defer b.stop()
		done := make(chan struct{})
		close(done)
		if b.wait(done) {
			t.Fatal("wait = true with done closed")
		}
	})
	t.Run("sleep until done", func(t *testing.T) {
		b := newBackoff(time.Hour, time.Hour, time.Now().Add(2*time.Hour), true)
		defer b.stop()
		done := make(chan struct{})
		go func() { close(done) }()
		if b.sleep(time.Hour, done) {
			t.Fatal("sleep = true, though done was closed an hour before its end")
		}
	})
	t.Run("stop without a timer", func(t *testing.T) {
		b := newBackoff(time.Millisecond, time.Millisecond, time.Now(), false)
		b.stop()
	})
}
