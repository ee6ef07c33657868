package idempotency

import (
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"
)

// FuzzRetryAfter checks retryAfter against the rules: delta-seconds are
// digits only and any number of them; an HTTP-date in one of the three forms
// of http.ParseTime; the wait clamped to [0, limit]; only the first field
// counts.
func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, seed := range []struct {
		value string
		limit int64
	}{
		{"", int64(time.Minute)},
		{"0", int64(time.Minute)},
		{"7", int64(time.Minute)},
		{" 7\t", int64(time.Minute)},
		{"61", int64(time.Minute)},
		{"1", int64(1500 * time.Millisecond)},
		{"2", int64(1500 * time.Millisecond)},
		{"9223372036", int64(time.Duration(1<<63 - 1))},
		{"9223372037", int64(time.Duration(1<<63 - 1))},
		{"9223372036854775807", int64(time.Duration(1<<63 - 1))},
		{"99999999999999999999999", int64(time.Hour)},
		{"-1", int64(time.Minute)},
		{"+5", int64(time.Minute)},
		{"1.5", int64(time.Minute)},
		{"0x10", int64(time.Minute)},
		{"1_0", int64(time.Minute)},
		{"5", 0},
		{"5", -1},
		{now.Add(10 * time.Second).Format(http.TimeFormat), int64(time.Minute)},
		{now.Add(time.Hour).Format(http.TimeFormat), int64(time.Minute)},
		{now.Add(-time.Hour).Format(http.TimeFormat), int64(time.Minute)},
		{now.Add(12 * time.Second).Format(time.RFC850), int64(time.Minute)},
		{now.Add(5 * time.Second).Format(time.ANSIC), int64(time.Minute)},
		{"Fri, 31 Dec 9999 23:59:59 GMT", int64(time.Duration(1<<63 - 1))},
		{"Mon, 01 Jan 0001 00:00:00 GMT", int64(time.Minute)},
		{"Sun, 01 Mar 2026 12:00:10 +0100", int64(time.Minute)},
	} {
		f.Add(seed.value, now.UnixNano(), seed.limit)
	}
	f.Fuzz(func(t *testing.T, value string, nowNano, limit int64) {
		now := time.Unix(0, nowNano).UTC()
		h := http.Header{"Retry-After": {value, "1"}}
		wait, ok := retryAfter(h, now, time.Duration(limit))

		if ok && (wait < 0 || wait > time.Duration(limit)) {
			t.Fatalf("retryAfter(%q, limit %v) = %v, out of [0, limit]", value, time.Duration(limit), wait)
		}
		if got, gotOK := retryAfter(http.Header{"Retry-After": {value}}, now, time.Duration(limit)); got != wait || gotOK != ok {
			t.Fatalf("retryAfter(%q) = %v, %v alone, %v, %v before another field", value, got, gotOK, wait, ok)
		}
		want, wantOK := referenceRetryAfter(value, now, time.Duration(limit))
		if ok != wantOK || wait != want {
			t.Fatalf("retryAfter(%q, now %v, limit %v) = %v, %v; want %v, %v",
				value, now, time.Duration(limit), wait, ok, want, wantOK)
		}
	})
}

// referenceRetryAfter reads a Retry-After value as RFC 9110, section 10.2.3,
// says, with arbitrary precision for the seconds.
func referenceRetryAfter(value string, now time.Time, limit time.Duration) (time.Duration, bool) {
	v := strings.Trim(value, " \t")
	if limit <= 0 || v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		secs, _ := new(big.Int).SetString(v, 10)
		d := secs.Mul(secs, big.NewInt(int64(time.Second)))
		if d.Cmp(big.NewInt(int64(limit))) > 0 {
			return limit, true
		}
		return time.Duration(d.Int64()), true
	}
	if v[0] >= '0' && v[0] <= '9' {
		return 0, false
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if !t.After(now) {
		return 0, true
	}
	d := t.Sub(now) // saturates
	return min(d, limit), true
}
