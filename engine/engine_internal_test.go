package engine

import (
	"context"
	"math"
	"testing"
	"time"
)

// nopStore is a Store that answers nothing; New only keeps it.
type nopStore struct{}

func (nopStore) Claim(context.Context, ID, string, time.Duration, time.Duration) (Claim, error) {
	return Claim{}, nil
}
func (nopStore) Complete(context.Context, ID, Token, *Response, time.Duration) error { return nil }
func (nopStore) Release(context.Context, ID, Token) error                            { return nil }
func (nopStore) Extend(context.Context, ID, Token, time.Duration) error              { return nil }

// TestNewDefaults: New fills in the zero fields, bounds the long ones, and
// keeps what was given.
func TestNewDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want Config
	}{
		{"zero", Config{},
			Config{TTL: defaultTTL, Lease: defaultLease, StoreTimeout: defaultStoreTimeout, RetryAfter: defaultRetryAfter}},
		{"a TTL shorter than the default lease is the lease", Config{TTL: 20 * time.Second},
			Config{TTL: 20 * time.Second, Lease: 20 * time.Second, StoreTimeout: defaultStoreTimeout, RetryAfter: defaultRetryAfter}},
		{"past maxDuration is maxDuration", Config{TTL: math.MaxInt64, Lease: math.MaxInt64},
			Config{TTL: maxDuration, Lease: maxDuration, StoreTimeout: defaultStoreTimeout, RetryAfter: defaultRetryAfter}},
		{"kept as given",
			Config{TTL: time.Hour, Lease: time.Second, StoreTimeout: time.Millisecond, Wait: time.Minute, RetryAfter: 3 * time.Second, Abandoned: RefuseAbandoned, FailOpen: true},
			Config{TTL: time.Hour, Lease: time.Second, StoreTimeout: time.Millisecond, Wait: time.Minute, RetryAfter: 3 * time.Second, Abandoned: RefuseAbandoned, FailOpen: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(nopStore{}, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := e.cfg
			if got.Logger == nil {
				t.Error("no logger")
			}
			if _, ok := got.Logger.Handler().(*rateLimited); !ok {
				t.Errorf("the logger's handler is %T, want it rate-limited", got.Logger.Handler())
			}
			got.Logger = nil
			if !sameConfig(got, tc.want) {
				t.Errorf("New(%+v) runs with %+v, want %+v", tc.cfg, got, tc.want)
			}
			if e.binder != nil {
				t.Error("a Store that is no Binder is taken for one")
			}
		})
	}
}

// TestSaturation: sums of the configuration's durations never wrap.
func TestSaturation(t *testing.T) {
	now := time.Now()
	if got := addSat(now, time.Second); !got.Equal(now.Add(time.Second)) {
		t.Errorf("addSat(now, 1s) = %v, want %v", got, now.Add(time.Second))
	}
	if got := addSat(now, math.MaxInt64); got.Before(now) {
		t.Errorf("addSat(now, max) = %v, before now", got)
	}
	if got := addSat(now, -time.Second); !got.Equal(now.Add(-time.Second)) {
		t.Errorf("addSat(now, -1s) = %v, want a second before now", got)
	}
	for _, tc := range []struct{ a, b, want time.Duration }{
		{1, 2, 3},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{math.MaxInt64 - 1, 2, math.MaxInt64},
		{-5, time.Millisecond, time.Millisecond - 5},
	} {
		if got := addDur(tc.a, tc.b); got != tc.want {
			t.Errorf("addDur(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestClaimTimeout: a Claim is bounded by the store timeout, and by the
// lease less its margin: a lease granted later is too short to run under.
func TestClaimTimeout(t *testing.T) {
	for _, tc := range []struct {
		storeTimeout, lease, want time.Duration
	}{
		{time.Second, time.Minute, time.Second},
		{time.Minute, time.Second, 900 * time.Millisecond},
		{time.Second, 10 * time.Millisecond, 9 * time.Millisecond},
	} {
		e := &Engine{cfg: Config{StoreTimeout: tc.storeTimeout, Lease: tc.lease}}
		if got := e.claimTimeout(); got != tc.want {
			t.Errorf("claimTimeout with store timeout %v, lease %v = %v, want %v", tc.storeTimeout, tc.lease, got, tc.want)
		}
	}
}

// TestFinal: the store errors that no try can change.
func TestFinal(t *testing.T) {
	for _, tc := range []struct {
		err         error
		final, late bool
	}{
		{nil, false, false},
		{ErrLeaseLost, true, false},
		{ErrLeaseExpired, true, false},
		{ErrNotCommitted, true, false},
		{ErrNotStorable, true, false},
		{ErrStoreClosed, true, false},
		{context.DeadlineExceeded, false, true},
		{ErrStoreUnavailable, false, true},
	} {
		if got := final(tc.err); got != tc.final {
			t.Errorf("final(%v) = %v, want %v", tc.err, got, tc.final)
		}
		if got := storeLater(tc.err); got != tc.late {
			t.Errorf("storeLater(%v) = %v, want %v", tc.err, got, tc.late)
		}
	}
}

// sameConfig compares the fields of a and b that are values.
func sameConfig(a, b Config) bool {
	return a.TTL == b.TTL && a.Lease == b.Lease && a.StoreTimeout == b.StoreTimeout && a.Wait == b.Wait &&
		a.RetryAfter == b.RetryAfter && a.Abandoned == b.Abandoned && a.FailOpen == b.FailOpen &&
		a.Logger == b.Logger && (a.Observer == nil) == (b.Observer == nil)
}
