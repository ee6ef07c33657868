package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemkit/idempotency/internal/steps"
)

// Step is the record of one step of a call (package step runs them): a
// named part of the work whose result is kept under the call's key, so
// that a later holder of the key (after a takeover, or after a release)
// gets the result instead of running the step again.
type Step struct {
	// Name names the step within its call: a non-empty string of valid
	// UTF-8 without control characters (C0, DEL or C1), at most 255
	// bytes.
	Name string
	// Fingerprint identifies the step's input. A Step whose Fingerprint is
	// empty is not a record: StepStore.SaveStep removes the step's record.
	Fingerprint string
	// Done reports that the step finished: Result holds what it returned.
	// A step that is not Done was started and never finished (its holder
	// recorded the start, as it does under RefuseAbandoned, and was lost).
	Done bool
	// Result is the step's encoded result (Done), byte for byte.
	Result []byte
}

// StepStore is implemented by a Store that keeps the steps of a call
// (package step): memstore, pgstore, redisstore, sqlitestore and
// mysqlstore do. Its records hold steps beside the lease, and its methods
// treat them so:
//
//   - Claim returns, with Acquired, the steps the record holds (after a
//     takeover, or after a release), in any order; a new record has none,
//     and learning so costs no round trip of its own.
//   - Release keeps the steps: a record that holds steps is not deleted by
//     the release of the holder that created it, but goes back, as after
//     the release of a takeover, to in flight with its lease over, its
//     lost holders counted as before, its expiry kept; the next Claim with
//     the same fingerprint takes it over at once, with the steps, and one
//     with another fingerprint is refused (InFlight, RetryAfter zero).
//   - Complete drops the steps with the lease: the stored response is the
//     call's result. Inspector.Resolve drops them too, and a record's
//     steps expire with it.
type StepStore interface {
	Store
	// SaveStep records step under the lease that token holds, replacing
	// any record of a step of the same name; with an empty Fingerprint it
	// removes that record instead. It fails with ErrLeaseLost, and changes
	// nothing, unless token is the record's current token and the record
	// is in flight, and with an error wrapping ErrNotStorable when the
	// step takes more than 64 KiB (65,536 bytes: its name, fingerprint
	// and result together) or the record would hold more than 100 steps.
	SaveStep(ctx context.Context, id ID, token Token, step Step) error
}

// journalSaver records a call's steps: a Call, seen as a steps.Saver.
type journalSaver Call

// SaveStep records e under the call's lease, trying again within the store
// timeout until the store takes it or refuses it for good. Its context
// keeps ctx's values (a Binder's state: a transactional store records the
// step in the call's own transaction) but not its cancellation: a step that
// ran is recorded even if its caller has gone.
//
// A step's start (RefuseAbandoned) that the store did not take may have
// been recorded all the same: the store applied it and its answer was
// lost, or came after the timeout. The step does not run, so the start is
// taken back, within another store timeout: left there, it would tell the
// retry that the step's outcome is unknown when it never ran.
func (s *journalSaver) SaveStep(ctx context.Context, st steps.Entry) error {
	c := (*Call)(s)
	e := c.e
	// In transactional mode the step is written in the call's
	// transaction, on its one connection, which must not be sent two
	// statements at once; in lease mode the writes would queue on the
	// record's row lock all the same. Once the work has returned, the
	// call is being settled: a step recorded now would race its Complete
	// or Release.
	c.journal.Saves.Lock()
	defer c.journal.Saves.Unlock()
	if c.journal.Settled {
		return fmt.Errorf("engine: step %q not recorded: the call's work has returned: %w", st.Name, ErrLeaseLost)
	}
	step := Step{Name: st.Name, Fingerprint: st.Fingerprint, Done: st.Done, Result: st.Result}
	err := c.saveStep(ctx, step)
	if err == nil {
		return nil
	}
	e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idempotency step not recorded",
		slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.String("step", st.Name), slog.Any("error", err))
	if step.Fingerprint != "" && !step.Done && !final(err) {
		if rerr := c.saveStep(ctx, Step{Name: step.Name}); rerr != nil {
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idempotency step's start not taken back; if it was recorded, the retry is told that the step's outcome is unknown",
				slog.String("key", c.lease.Key), slog.String("scope", c.lease.Scope), slog.String("step", st.Name), slog.Any("error", rerr))
		}
	}
	return fmt.Errorf("engine: step %q not recorded: %w", st.Name, errors.Join(ErrStoreUnavailable, err))
}

// Ended reports why the call's work can begin no more steps: its lease
// ended unrenewed or was lost, or the work returned and the call was
// settled. A caller gone is not a reason: the lease is still held, and a
// work that goes on for its own sake (on a context detached from its
// caller's) records its steps.
func (s *journalSaver) Ended() error {
	rn := &(*Call)(s).renewal
	rn.mu.Lock()
	defer rn.mu.Unlock()
	switch {
	case rn.ended:
		return fmt.Errorf("engine: %w", ErrLeaseExpired)
	case rn.stopped:
		return fmt.Errorf("engine: the call's work has returned, and holds no lease: %w", ErrLeaseLost)
	}
	return nil
}

// saveStep records step with SaveStep, trying again within the store
// timeout until the store takes it or refuses it for good.
func (c *Call) saveStep(ctx context.Context, step Step) error {
	e := c.e
	store := e.store.(StepStore)
	sctx := new(detached)
	sctx.init(ctx, e.cfg.StoreTimeout)
	defer sctx.stop()
	b := writeBackoff(sctx)
	defer b.stop()
	for {
		err := store.SaveStep(sctx, c.lease.ID, c.lease.Token, step)
		if err == nil || final(err) || !b.wait(nil) {
			return err
		}
	}
}

// startJournal readies the call's journal of steps, with the steps its
// Claim returned.
func (c *Call) startJournal(loaded []Step) {
	e := c.e
	var saver steps.Saver
	if _, ok := e.store.(StepStore); ok {
		saver = (*journalSaver)(c)
	}
	var entries []steps.Entry
	if len(loaded) > 0 {
		entries = make([]steps.Entry, len(loaded))
		for i, s := range loaded {
			entries[i] = steps.Entry{Name: s.Name, Fingerprint: s.Fingerprint, Done: s.Done, Result: s.Result}
		}
	}
	c.journal.Reset(saver, e.cfg.Codec, e.cfg.Abandoned == RefuseAbandoned, entries)
}
