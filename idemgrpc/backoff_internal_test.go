package idemgrpc

import (
	"math"
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	for _, c := range []struct{ base, limit time.Duration }{
		{0, 0}, {time.Millisecond, time.Millisecond}, {time.Millisecond, time.Second}, {1, math.MaxInt64}, {math.MaxInt64, math.MaxInt64},
	} {
		cfg := &clientConfig{baseDelay: c.base, maxDelay: c.limit}
		for n := range 70 {
			d := cfg.backoff(n)
			if d < 0 || d > c.limit {
				t.Fatalf("backoff(%d) with %v..%v = %v, outside [0, %v]", n, c.base, c.limit, d, c.limit)
			}
			if c.base > 0 && c.base < time.Hour && n < 20 && d > c.base<<n {
				t.Fatalf("backoff(%d) with base %v = %v, over base·2ⁿ", n, c.base, d)
			}
		}
	}
}
