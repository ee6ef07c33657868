package storetest_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/storetest"
)

func TestMemstore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) engine.Store {
		s, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// brokenStores are deliberately wrong Stores, each with the subtests of the
// suite that must catch it.
var brokenStores = map[string]struct {
	store    func(memstore.Store) engine.Store
	mustFail []string
}{
	"ignores-tokens": {
		store:    func(m memstore.Store) engine.Store { return ignoresTokens{m} },
		mustFail: []string{"StaleTokenRefused", "LeaseExpiryAndTakeover"},
	},
	"check-then-insert": {
		store:    func(m memstore.Store) engine.Store { return &checkThenInsert{Store: m, held: map[engine.ID]bool{}} },
		mustFail: []string{"ConcurrentClaimers"},
	},
	"text-only": {
		store:    func(m memstore.Store) engine.Store { return textOnly{m} },
		mustFail: []string{"BinaryRoundTrip", "LargeBody"},
	},
	"never-abandoned": {
		store:    func(m memstore.Store) engine.Store { return neverAbandoned{m} },
		mustFail: []string{"TakeoverCountsAbandoned", "ExtendKeepsAbandoned", "TinyDurations"},
	},
	"release-expires-lease": {
		store:    func(m memstore.Store) engine.Store { return releaseExpiresLease{m} },
		mustFail: []string{"AbandonedZeroWhenNew", "ReleaseKeepsAbandoned"},
	},
	"release-forgets-abandoned": {
		store:    func(m memstore.Store) engine.Store { return releaseForgetsAbandoned{m} },
		mustFail: []string{"ReleaseKeepsAbandoned"},
	},
	"record-dies-with-lease": {
		store:    func(m memstore.Store) engine.Store { return recordDiesWithLease{m} },
		mustFail: []string{"RecordOutlivesLease"},
	},
	"overflows": {
		store:    func(m memstore.Store) engine.Store { return overflows{m} },
		mustFail: []string{"MaxTTL", "MaxLease"},
	},
	"sub-millisecond-is-forever": {
		store:    func(m memstore.Store) engine.Store { return subMillisecondForever{m} },
		mustFail: []string{"TinyDurations"},
	},
	"not-found-unwrapped": {
		store:    func(m memstore.Store) engine.Store { return notFoundUnwrapped{m} },
		mustFail: []string{"LookupNotFound", "ResolveNotFound"},
	},
	"resolve-by-token": {
		store:    func(m memstore.Store) engine.Store { return resolveByToken{m} },
		mustFail: []string{"ResolveWithResponse", "ResolveForget"},
	},
	"step-ignores-token": {
		store:    func(m memstore.Store) engine.Store { return stepIgnoresToken{m} },
		mustFail: []string{"StepStaleTokenRefused", "StepResolveDropsSteps"},
	},
	"release-drops-steps": {
		store:    func(m memstore.Store) engine.Store { return releaseDropsSteps{m} },
		mustFail: []string{"StepReleaseKeepsSteps", "StepReleaseOfTakeover", "StepsExpireWithRecord"},
	},
	"claim-hides-steps": {
		store:    func(m memstore.Store) engine.Store { return claimHidesSteps{m} },
		mustFail: []string{"StepsOnTakeover", "StepReleaseKeepsSteps", "StepBinaryRoundTrip"},
	},
	"no-step-limits": {
		store:    func(m memstore.Store) engine.Store { return noStepLimits{m} },
		mustFail: []string{"StepLimits"},
	},
	"times-without-epoch": {
		store:    func(m memstore.Store) engine.Store { return timesWithoutEpoch{m, time.Now()} },
		mustFail: []string{"LookupInFlight", "LookupCompleted"},
	},
}

// TestSuiteCatchesBrokenStores runs the suite, in a child process, against
// each broken store, and checks that the subtests meant to catch it fail.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	for name, b := range brokenStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "STORETEST_BROKEN="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("suite passed against the %s store, want failures:\n%s", name, out)
			}
			for _, sub := range b.mustFail {
				if !bytes.Contains(out, []byte("--- FAIL: TestBrokenStore/"+sub+" ")) {
					t.Errorf("subtest %s did not fail against the %s store; output:\n%s", sub, name, out)
				}
			}
		})
	}
}

// TestBrokenStore is the child process of TestSuiteCatchesBrokenStores; it
// does nothing in a normal run.
func TestBrokenStore(t *testing.T) {
	name := os.Getenv("STORETEST_BROKEN")
	if name == "" {
		return
	}
	storetest.Run(t, func(t *testing.T) engine.Store {
		m, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return brokenStores[name].store(m)
	})
}

// ignoresTokens completes, releases and extends whatever the token.
type ignoresTokens struct{ memstore.Store }

func (s ignoresTokens) Complete(ctx context.Context, id engine.ID, _ engine.Token, resp *engine.Response, ttl time.Duration) error {
	c, err := s.Store.Claim(ctx, id, "", time.Nanosecond, ttl)
	if err != nil {
		return err
	}
	if c.Status == engine.Acquired {
		return s.Store.Complete(ctx, id, c.Token, resp, ttl)
	}
	return nil
}

func (s ignoresTokens) Release(context.Context, engine.ID, engine.Token) error { return nil }

func (s ignoresTokens) Extend(context.Context, engine.ID, engine.Token, time.Duration) error {
	return nil
}

// checkThenInsert looks for a record, then creates one: two claimers can
// both see none.
type checkThenInsert struct {
	memstore.Store
	mu   sync.Mutex
	held map[engine.ID]bool
}

func (s *checkThenInsert) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	s.mu.Lock()
	seen := s.held[id]
	s.mu.Unlock()
	if seen {
		return s.Store.Claim(ctx, id, fp, lease, ttl)
	}
	runtime.Gosched()
	s.mu.Lock()
	s.held[id] = true
	s.mu.Unlock()
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if err == nil && c.Status == engine.InFlight {
		c = engine.Claim{Status: engine.Acquired, Token: 1}
	}
	return c, err
}

// textOnly stores bodies and headers as valid UTF-8 text, as a store that
// used a text column would.
type textOnly struct{ memstore.Store }

func (s textOnly) Complete(ctx context.Context, id engine.ID, tok engine.Token, resp *engine.Response, ttl time.Duration) error {
	r := *resp
	r.Body = []byte(strings.ToValidUTF8(string(resp.Body), "?"))
	r.Header = http.Header(resp.Header).Clone()
	for k, vs := range r.Header {
		for i, v := range vs {
			r.Header[k][i] = strings.ToValidUTF8(v, "?")
		}
	}
	return s.Store.Complete(ctx, id, tok, &r, ttl)
}

// neverAbandoned reports every acquired claim as a new record's.
type neverAbandoned struct{ memstore.Store }

func (s neverAbandoned) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	c.Abandoned = 0
	return c, err
}

// releaseExpiresLease releases by ending the lease instead of deleting the
// record, so that the next claim counts the releaser as abandoned.
type releaseExpiresLease struct{ memstore.Store }

func (s releaseExpiresLease) Release(ctx context.Context, id engine.ID, tok engine.Token) error {
	return s.Store.Extend(ctx, id, tok, time.Nanosecond)
}

// releaseForgetsAbandoned deletes the record on every release, so that a
// takeover that gives the key back forgets the holders lost before it.
type releaseForgetsAbandoned struct{ memstore.Store }

func (s releaseForgetsAbandoned) Release(ctx context.Context, id engine.ID, tok engine.Token) error {
	if err := s.Store.Release(ctx, id, tok); err != nil {
		return err
	}
	if err := s.Store.Resolve(ctx, id, nil, 0); err != nil && !errors.Is(err, engine.ErrNotFound) {
		return err
	}
	return nil
}

// recordDiesWithLease lets an in-flight record expire when its lease ends,
// whatever the TTL, as a store that takes the larger of the two does when
// the TTL is no longer than the lease.
type recordDiesWithLease struct{ memstore.Store }

func (s recordDiesWithLease) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	return s.Store.Claim(ctx, id, fp, lease, time.Nanosecond)
}

// overflows computes deadlines as a store that adds a duration to the Unix
// time in nanoseconds without saturating does: past the year 2262 the sum
// wraps to a time before 1970, a deadline already past.
type overflows struct{ memstore.Store }

func wrapped(d time.Duration) time.Duration {
	now := time.Now().UnixNano()
	if deadline := now + int64(d); deadline < now {
		return 0
	}
	return d
}

func (s overflows) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	return s.Store.Claim(ctx, id, fp, wrapped(lease), wrapped(ttl))
}

func (s overflows) Complete(ctx context.Context, id engine.ID, tok engine.Token, resp *engine.Response, ttl time.Duration) error {
	return s.Store.Complete(ctx, id, tok, resp, wrapped(ttl))
}

func (s overflows) Extend(ctx context.Context, id engine.ID, tok engine.Token, lease time.Duration) error {
	return s.Store.Extend(ctx, id, tok, wrapped(lease))
}

// subMillisecondForever rounds durations to milliseconds and takes 0 for
// "no expiry", as a store that leaves out PX 0 would.
type subMillisecondForever struct{ memstore.Store }

func roundToForever(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return math.MaxInt64
	}
	return d
}

func (s subMillisecondForever) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	return s.Store.Claim(ctx, id, fp, roundToForever(lease), roundToForever(ttl))
}

func (s subMillisecondForever) Complete(ctx context.Context, id engine.ID, tok engine.Token, resp *engine.Response, ttl time.Duration) error {
	return s.Store.Complete(ctx, id, tok, resp, roundToForever(ttl))
}

func (s subMillisecondForever) Extend(ctx context.Context, id engine.ID, tok engine.Token, lease time.Duration) error {
	return s.Store.Extend(ctx, id, tok, roundToForever(lease))
}

// notFoundUnwrapped reports a missing record with an error of its own.
type notFoundUnwrapped struct{ memstore.Store }

func unwrapNotFound(err error) error {
	if errors.Is(err, engine.ErrNotFound) {
		return errors.New("no such record")
	}
	return err
}

func (s notFoundUnwrapped) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	r, err := s.Store.Lookup(ctx, id)
	return r, unwrapNotFound(err)
}

func (s notFoundUnwrapped) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	return unwrapNotFound(s.Store.Resolve(ctx, id, resp, ttl))
}

// resolveByToken settles a record as its holder would: completing it with
// the current token, or forgetting it by ending the lease. Neither works on a
// completed record, and ending the lease leaves the holder's token valid.
type resolveByToken struct{ memstore.Store }

func (s resolveByToken) Resolve(ctx context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	r, err := s.Store.Lookup(ctx, id)
	if err != nil {
		return err
	}
	if resp == nil {
		return s.Store.Extend(ctx, id, r.Token, time.Nanosecond)
	}
	return s.Store.Complete(ctx, id, r.Token, resp, ttl)
}

// timesWithoutEpoch reports times on the store's own clock as if they were
// wall-clock times: offsets from when it started, counted from 1970.
type timesWithoutEpoch struct {
	memstore.Store
	start time.Time
}

func (s timesWithoutEpoch) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	r, err := s.Store.Lookup(ctx, id)
	for _, t := range []*time.Time{&r.Created, &r.LeaseEnds, &r.Expires} {
		if !t.IsZero() {
			*t = time.Unix(0, int64(t.Sub(s.start)))
		}
	}
	return r, err
}

// stepIgnoresToken records a step under whatever lease holds the record.
type stepIgnoresToken struct{ memstore.Store }

func (s stepIgnoresToken) SaveStep(ctx context.Context, id engine.ID, _ engine.Token, st engine.Step) error {
	r, err := s.Lookup(ctx, id)
	if err != nil {
		return engine.ErrLeaseLost
	}
	if r.Completed {
		// Revive the record in flight, steps and all, as a store
		// that keys steps apart from the record would.
		return nil
	}
	return s.Store.SaveStep(ctx, id, r.Token, st)
}

// releaseDropsSteps forgets a record's steps when its holder releases it.
type releaseDropsSteps struct{ memstore.Store }

func (s releaseDropsSteps) Release(ctx context.Context, id engine.ID, tok engine.Token) error {
	if r, err := s.Lookup(ctx, id); err == nil && r.Token == tok {
		for _, st := range r.Steps {
			if err := s.Store.SaveStep(ctx, id, tok, engine.Step{Name: st.Name}); err != nil {
				return err
			}
		}
	}
	return s.Store.Release(ctx, id, tok)
}

// claimHidesSteps never returns the steps a record holds.
type claimHidesSteps struct{ memstore.Store }

func (s claimHidesSteps) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	c.Steps = nil
	return c, err
}

// noStepLimits drops, without a word, a step it will not keep.
type noStepLimits struct{ memstore.Store }

func (s noStepLimits) SaveStep(ctx context.Context, id engine.ID, tok engine.Token, st engine.Step) error {
	if err := s.Store.SaveStep(ctx, id, tok, st); err != nil && !errors.Is(err, engine.ErrNotStorable) {
		return err
	}
	return nil
}
