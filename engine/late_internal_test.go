package engine

import "testing"

// TestLateWorkBounds: beyond maxLate late Completes at once, or maxLateBytes
// of their responses, or after Shutdown, a late Complete gets no goroutine
// of its own.
func TestLateWorkBounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		bytes  int
		closed bool
		size   int
		want   bool
	}{
		{"room", 0, 0, false, 100, true},
		{"last place", maxLate - 1, 0, false, 100, true},
		{"full in number", maxLate, 0, false, 1, false},
		{"last bytes", 1, maxLateBytes - 100, false, 100, true},
		{"full in memory", 1, maxLateBytes - 100, false, 101, false},
		{"one response larger than the bound", 0, 0, false, maxLateBytes + 1, false},
		{"shut down", 0, 0, true, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lateWork{n: tc.n, bytes: tc.bytes, closed: tc.closed}
			ctx, ok := l.reserve(tc.size)
			if ok != tc.want {
				t.Fatalf("reserve(%d) = %v, want %v", tc.size, ok, tc.want)
			}
			if !ok {
				if l.n != tc.n || l.bytes != tc.bytes {
					t.Fatalf("a refused reservation changed the counts: n %d, bytes %d", l.n, l.bytes)
				}
				if ctx.Done() != nil {
					t.Fatal("the request's own late Complete has a context that Shutdown cancels")
				}
				return
			}
			l.done(tc.size)
			if l.n != tc.n || l.bytes != tc.bytes {
				t.Fatalf("after done: n %d, bytes %d; want %d, %d", l.n, l.bytes, tc.n, tc.bytes)
			}
		})
	}
}
