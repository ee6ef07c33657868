package idempotency

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBackoffCeiling(t *testing.T) {
	top := func(n int64) int64 { return n - 1 }
	bottom := func(int64) int64 { return 0 }
	const base, limit = 250 * time.Millisecond, 8 * time.Second
	tests := []struct {
		n    int
		want time.Duration
	}{
		{0, 250 * time.Millisecond},
		{1, 500 * time.Millisecond},
		{2, time.Second},
		{4, 4 * time.Second},
		{5, 8 * time.Second},
		{6, 8 * time.Second},
		{62, 8 * time.Second},
		{63, 8 * time.Second},
		{1000, 8 * time.Second},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, backoff(tt.n, base, limit, top), "backoff(%d) with the largest draw", tt.n)
		assert.Zero(t, backoff(tt.n, base, limit, bottom), "backoff(%d) with the smallest draw", tt.n)
	}
	assert.Equal(t, time.Duration(math.MaxInt64-1), backoff(70, time.Second, math.MaxInt64, top), "no overflow")
	assert.Zero(t, backoff(3, 0, limit, top), "base 0")
	assert.Zero(t, backoff(-1, base, limit, top), "negative n")
}

func TestBackoffFullJitter(t *testing.T) {
	// With the real source: every wait within [0, ceiling], and spread over
	// the whole range rather than bunched at its top.
	const base, limit = 100 * time.Millisecond, time.Second
	for n := range 6 {
		ceiling := min(base<<n, limit)
		var low, high int
		for range 2000 {
			d := backoff(n, base, limit, rand.Int64N)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, ceiling)
			if d < ceiling/4 {
				low++
			}
			if d > ceiling*3/4 {
				high++
			}
		}
		assert.Greater(t, low, 300, "n=%d: waits in the lowest quarter", n)
		assert.Greater(t, high, 300, "n=%d: waits in the highest quarter", n)
	}
}

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const limit = 30 * time.Second
	tests := []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"30", 30 * time.Second, true},
		{"31", limit, true},
		{"9223372036854775807", limit, true},
		{"99999999999999999999999", limit, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"7s", 0, false},
		{"20000000000000000000A", 0, false},
		{"99999999999999999999 1", 0, false},
		{"\t7\t", 7 * time.Second, true},
		{"\u00a07", 0, false},
		{"soon", 0, false},
		{now.Add(10 * time.Second).Format(http.TimeFormat), 10 * time.Second, true},
		{now.Add(time.Hour).Format(http.TimeFormat), limit, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{now.Add(12 * time.Second).Format(time.RFC850), 12 * time.Second, true},
		{now.Add(5 * time.Second).Format(time.ANSIC), 5 * time.Second, true},
		{"Sun, 01 Mar 2026 12:00:10 +0100", 0, false},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.value != "" {
			h.Set("Retry-After", tt.value)
		}
		got, ok := retryAfter(h, now, limit)
		assert.Equal(t, tt.ok, ok, "retryAfter(%q) ok", tt.value)
		assert.Equal(t, tt.want, got, "retryAfter(%q)", tt.value)
	}
	_, ok := retryAfter(http.Header{"Retry-After": {"5"}}, now, 0)
	assert.False(t, ok, "limit 0")
}

func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(1000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for range 50 {
		wg.Go(func() {
			for range 100 {
				if b.take(retryCost) {
					mu.Lock()
					taken++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 200, taken, "retries granted from 1000 tokens")
	assert.Zero(t, b.left())

	for range 50 {
		wg.Go(func() {
			for range 100 {
				b.refund(1)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 1000, b.left(), "refunds stop at the capacity")

	b.succeeded(3, 10)
	assert.Equal(t, 1000, b.left())
	var none *Budget
	assert.True(t, none.take(10), "a nil budget permits everything")
}

func TestBudgetLargestCapacity(t *testing.T) {
	b := NewBudget(math.MaxInt)
	require.True(t, b.take(timeoutRetryCost))
	b.refund(math.MaxInt64)
	assert.Equal(t, math.MaxInt, b.left(), "refund up to the capacity")
	require.True(t, b.take(retryCost))
	b.succeeded(2, 3*timeoutRetryCost)
	assert.Equal(t, math.MaxInt, b.left())
}

func TestReadUpTo(t *testing.T) {
	payload := strings.Repeat("0123456789", 100) // 1000 bytes
	tests := []struct {
		name     string
		limit    int64
		hint     int64
		complete bool
	}{
		{"well under the limit", 4096, 0, true},
		{"with a size hint", 4096, 1000, true},
		{"with a wrong small hint", 4096, 10, true},
		{"exactly the limit", 1000, 0, true},
		{"one byte over", 999, 0, false},
		{"far over", 10, 0, false},
		{"limit zero", 0, 0, false},
		{"largest limit", math.MaxInt64, 0, true},
		{"largest limit and hint", math.MaxInt64, math.MaxInt64, true},
		{"hint past the limit", 10, math.MaxInt64, false},
		{"hint of a terabyte", math.MaxInt64, 1 << 40, true},
		{"negative limit", -5, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(payload), iotest.OneByteReader(strings.NewReader(payload)), iotest.DataErrReader(strings.NewReader(payload))} {
				buf, complete, err := readUpTo(r, tt.limit, tt.hint)
				require.NoError(t, err)
				assert.Equal(t, tt.complete, complete)
				assert.LessOrEqual(t, cap(buf), max(2*len(payload), maxPrealloc+1), "capacity of the buffer")
				if complete {
					assert.Equal(t, payload, string(buf))
				} else {
					assert.Equal(t, payload[:max(tt.limit, 0)+1], string(buf), "what was read")
					rest, _ := io.ReadAll(r)
					assert.Equal(t, payload, string(buf)+string(rest), "nothing lost")
				}
			}
		})
	}
	buf, complete, err := readUpTo(bytes.NewReader(nil), 10, 0)
	assert.NoError(t, err)
	assert.True(t, complete)
	assert.Empty(t, buf)
}

// FuzzReadUpTo checks readUpTo's contract on arbitrary bodies, limits, size
// hints and read sizes, and that its buffer grows with the bytes read, not
// with what the hint or the limit say.
func FuzzReadUpTo(f *testing.F) {
	f.Add([]byte("payload"), int64(100), int64(7), uint8(0))
	f.Add([]byte("payload"), int64(7), int64(0), uint8(1))
	f.Add([]byte("payload"), int64(6), int64(7), uint8(3))
	f.Add([]byte(""), int64(0), int64(0), uint8(0))
	f.Add([]byte("x"), int64(-1), int64(-1), uint8(0))
	f.Add([]byte("payload"), int64(math.MaxInt64), int64(math.MaxInt64), uint8(0))
	f.Add([]byte("payload"), int64(math.MaxInt64), int64(1<<40), uint8(2))
	f.Add(bytes.Repeat([]byte("z"), 5000), int64(math.MaxInt64), int64(100), uint8(200))
	f.Fuzz(func(t *testing.T, body []byte, limit, hint int64, chunk uint8) {
		var r io.Reader = bytes.NewReader(body)
		if chunk > 0 {
			r = &limitedReads{r: r, n: int(chunk)}
		}
		buf, complete, err := readUpTo(r, limit, hint)
		if err != nil {
			t.Fatalf("readUpTo() error = %v", err)
		}
		if fits := int64(len(body)) <= max(limit, 0); complete != fits {
			t.Fatalf("readUpTo(%d bytes, limit %d) complete = %v, want %v", len(body), limit, complete, fits)
		}
		if complete && !bytes.Equal(buf, body) {
			t.Fatalf("readUpTo() = %d bytes, want the %d of the body", len(buf), len(body))
		}
		if !complete {
			if int64(len(buf)) != max(limit, 0)+1 {
				t.Fatalf("readUpTo(limit %d) read %d bytes, want limit+1", limit, len(buf))
			}
			rest, _ := io.ReadAll(r)
			if !bytes.Equal(append(buf, rest...), body) {
				t.Fatal("what was read and what is left are not the body")
			}
		}
		if most := max(2*(maxPrealloc+1), 3*len(buf)); cap(buf) > most {
			t.Fatalf("readUpTo(%d bytes, limit %d, hint %d) buffer capacity = %d, want at most %d", len(body), limit, hint, cap(buf), most)
		}
	})
}

// limitedReads returns at most n bytes per Read.
type limitedReads struct {
	r io.Reader
	n int
}

func (l *limitedReads) Read(p []byte) (int, error) {
	return l.r.Read(p[:min(len(p), l.n)])
}
