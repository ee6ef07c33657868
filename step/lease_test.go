package step_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/step"
)

// staleHolder runs a step under id as a holder whose lease runs out
// unrenewed while the step's function runs. The function returns "stale"
// once the lease is over and proceed is closed; what step.Run then
// returned is sent on the channel it returns, and the holder hangs until
// the test ends. It returns once the lease is over.
func staleHolder(t *testing.T, store engine.Store, cfg engine.Config, id engine.ID, proceed <-chan struct{}) <-chan error {
	t.Helper()
	cfg.Lease = 150 * time.Millisecond
	r := runner(t, noExtend{store.(engine.StepStore)}, quiet(cfg))
	over := make(chan struct{})
	stepErr := make(chan error, 1)
	done := make(chan struct{})
	unhang := make(chan struct{})
	t.Cleanup(func() {
		close(unhang)
		<-done
	})
	go func() {
		defer close(done)
		_, _ = once.Do(context.Background(), r, id, "input", func(ctx context.Context) (string, error) {
			_, err := step.Run(ctx, "charge", 1, func(ctx context.Context) (string, error) {
				<-ctx.Done() // the lease ended unrenewed
				close(over)
				select { // and the function goes on regardless
				case <-proceed:
				case <-unhang:
				}
				return "stale", nil
			})
			stepErr <- err
			// Hung: it neither completes nor releases until the test
			// ends; by then it was taken over, and is fenced off.
			<-unhang
			return "", err
		})
	}()
	<-over
	return stepErr
}

// TestLeaseLostWhileStepRuns: a holder whose lease ends while its step
// runs is taken over; the takeover runs the step (the physical limit of
// the default policy) or, under RefuseAbandoned, is told that its outcome
// is unknown; the stale holder's result is then refused by fencing, and
// step.Run tells its handler so, with an error wrapping ErrLeaseLost. The
// takeover's record is untouched.
func TestLeaseLostWhileStepRuns(t *testing.T) {
	for _, policy := range []engine.AbandonedPolicy{engine.RerunAbandoned, engine.RefuseAbandoned} {
		t.Run(fmt.Sprint("policy=", policy), func(t *testing.T) {
			forEachStore(t, func(t *testing.T, store engine.Store) {
				cfg := engine.Config{Abandoned: policy}
				id := engine.ID{Key: "lost-" + t.Name()}
				proceed := make(chan struct{})
				stale := staleHolder(t, store, cfg, id, proceed)
				r := runner(t, store, quiet(cfg))
				v, err := awaitDo(t, r, id, func(ctx context.Context) (string, error) {
					v, err := step.Run(ctx, "charge", 1, func(context.Context) (string, error) { return "fresh", nil })
					if policy == engine.RefuseAbandoned {
						require.ErrorIs(t, err, engine.ErrOutcomeUnknown)
						return "unknown", nil
					}
					return v, err
				})
				require.NoError(t, err)
				close(proceed)
				err = <-stale
				assert.ErrorIs(t, err, engine.ErrLeaseLost, "the stale holder learns that its step was not recorded")
				assert.ErrorContains(t, err, "not recorded")
				again, err := once.Do(context.Background(), r, id, "input", func(context.Context) (string, error) {
					t.Error("a completed call ran again")
					return "", nil
				})
				require.NoError(t, err)
				assert.Equal(t, v, again, "the takeover's result stands")
			})
		})
	}
}

// TestTakeoverDuringSave: the stale holder's result is saved while the
// takeover claims the key, in a race. Whatever wins, the takeover sees the
// step whole or not at all, and never sees it while the holder is told it
// was not recorded, or misses it when the holder is told it was.
func TestTakeoverDuringSave(t *testing.T) {
	forEachStore(t, func(t *testing.T, store engine.Store) {
		r := runner(t, store, quiet(engine.Config{}))
		var saved, fenced int
		defer func() { t.Logf("the stale holder's result saved %d times, fenced %d times", saved, fenced) }()
		for i := range 8 {
			id := engine.ID{Key: fmt.Sprint("race-", i, "-", t.Name())}
			proceed := make(chan struct{})
			stale := staleHolder(t, store, engine.Config{}, id, proceed)
			leaseOver(t, store, id)
			type answer struct {
				v   string
				err error
			}
			taken := make(chan answer, 1)
			go func() {
				v, err := awaitDo(t, r, id, func(ctx context.Context) (string, error) {
					return step.Run(ctx, "charge", 1, func(context.Context) (string, error) { return "fresh", nil })
				})
				taken <- answer{v, err}
			}()
			close(proceed)
			staleErr := <-stale
			got := <-taken
			require.NoError(t, got.err)
			if staleErr == nil {
				saved++
				assert.Equal(t, "stale", got.v, "#%d: the holder was told its step was recorded, and the takeover did not see it", i)
			} else {
				fenced++
				assert.ErrorIs(t, staleErr, engine.ErrLeaseLost, "#%d", i)
				assert.Equal(t, "fresh", got.v, "#%d: the holder was told its step was not recorded, and the takeover replayed it", i)
			}
		}
	})
}

// leaseOver waits until the store says that the lease on id is over: a
// Claim now takes it over at once.
func leaseOver(t *testing.T, store engine.Store, id engine.ID) {
	t.Helper()
	in := store.(engine.Inspector)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := in.Lookup(context.Background(), id)
		require.NoError(t, err)
		if !rec.Completed && time.Now().After(rec.LeaseEnds) {
			return
		}
		require.True(t, time.Now().Before(deadline), "the lease on %v did not end", id)
		time.Sleep(time.Millisecond)
	}
}

// TestPolicyChange: the policy changes between deploys while a call is
// taken over. A start recorded under RefuseAbandoned, read under the
// default policy, is a step that was running when its holder was lost: it
// runs again. A step that a holder under the default policy was running
// when it was lost left no record, and a takeover under RefuseAbandoned
// runs it again too (Abandoned tells the work); its finished steps replay.
// Under RefuseAbandoned alone, a lost holder that recorded only a start
// leaves that step "outcome unknown", and the call is resumed.
func TestPolicyChange(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lost, taker engine.AbandonedPolicy
		email       string // what the takeover's email step gives
	}{
		{"refuse then rerun", engine.RefuseAbandoned, engine.RerunAbandoned, "sent"},
		{"rerun then refuse", engine.RerunAbandoned, engine.RefuseAbandoned, "sent"},
		{"refuse then refuse", engine.RefuseAbandoned, engine.RefuseAbandoned, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, store engine.Store) {
				id := engine.ID{Key: "policy-" + t.Name()}
				hung := make(chan struct{})
				defer close(hung)
				chargeFirst := tc.lost != engine.RefuseAbandoned || tc.taker != engine.RefuseAbandoned
				lostHolder(t, store, quiet(engine.Config{Abandoned: tc.lost}), id, func(ctx context.Context) {
					if chargeFirst {
						_, err := step.Run(ctx, "charge", 1, func(context.Context) (string, error) { return "ch_1", nil })
						assert.NoError(t, err)
					}
					_, _ = step.Run(ctx, "email", 2, func(context.Context) (string, error) {
						<-hung // lost while sending
						return "", nil
					})
				})
				r := runner(t, store, quiet(engine.Config{Abandoned: tc.taker}))
				var ran []string
				v, err := awaitDo(t, r, id, func(ctx context.Context) (string, error) {
					l, _ := engine.LeaseFromContext(ctx)
					assert.Equal(t, 1, l.Abandoned)
					if chargeFirst {
						_, err := step.Run(ctx, "charge", 1, func(context.Context) (string, error) { ran = append(ran, "charge"); return "x", nil })
						require.NoError(t, err)
					}
					e, err := step.Run(ctx, "email", 2, func(context.Context) (string, error) { ran = append(ran, "email"); return "sent", nil })
					if errors.Is(err, engine.ErrOutcomeUnknown) {
						return "unknown", nil
					}
					return e, err
				})
				require.NoError(t, err)
				assert.Equal(t, tc.email, v)
				if tc.email == "sent" {
					assert.Equal(t, []string{"email"}, ran, "the charge replayed, the email ran again")
				} else {
					assert.Empty(t, ran)
				}
			})
		})
	}
}
