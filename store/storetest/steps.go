package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idempotency/engine"
)

// The limits of engine.StepStore: 100 steps a record, 64 KiB a step.
const (
	maxSteps    = 100
	maxStepSize = 64 << 10
)

// stepCases are the subtests of a Store that keeps steps
// (engine.StepStore); they are skipped for one that does not.
var stepCases = []struct {
	name string
	fn   func(t *testing.T, f fixture)
}{
	{"StepsNoneWhenNew", testStepsNoneWhenNew},
	{"StepsOnTakeover", testStepsOnTakeover},
	{"StepStaleTokenRefused", testStepStaleTokenRefused},
	{"StepReleaseKeepsSteps", testStepReleaseKeepsSteps},
	{"StepReleaseOfTakeover", testStepReleaseOfTakeover},
	{"StepCompleteDropsSteps", testStepCompleteDropsSteps},
	{"StepReplaceAndRemove", testStepReplaceAndRemove},
	{"StepsExpireWithRecord", testStepsExpireWithRecord},
	{"StepLimits", testStepLimits},
	{"StepConcurrentSaves", testStepConcurrentSaves},
	{"StepBinaryRoundTrip", testStepBinaryRoundTrip},
	{"StepResolveDropsSteps", testStepResolveDropsSteps},
}

// stepStore returns the fixture's Store as a StepStore, or skips.
func (f fixture) stepStore(t *testing.T) engine.StepStore {
	t.Helper()
	s, ok := f.store.(engine.StepStore)
	if !ok {
		t.Skipf("%T does not implement engine.StepStore", f.store)
	}
	return s
}

func (f fixture) saveStep(t *testing.T, s engine.StepStore, id engine.ID, tok engine.Token, st engine.Step) {
	t.Helper()
	if err := s.SaveStep(f.ctx, id, tok, st); err != nil {
		t.Fatalf("SaveStep(%v, %q) error = %v", id, st.Name, err)
	}
}

// assertSteps checks that got holds exactly want, in any order.
func assertSteps(t *testing.T, what string, got, want []engine.Step) {
	t.Helper()
	sorted := func(s []engine.Step) []engine.Step {
		s = slices.Clone(s)
		slices.SortFunc(s, func(a, b engine.Step) int { return strings.Compare(a.Name, b.Name) })
		return s
	}
	g, w := sorted(got), sorted(want)
	if len(g) != len(w) {
		t.Errorf("%s: %d steps %v, want %d %v", what, len(g), names(g), len(w), names(w))
		return
	}
	for i := range w {
		if g[i].Name != w[i].Name || g[i].Fingerprint != w[i].Fingerprint || g[i].Done != w[i].Done || !bytes.Equal(g[i].Result, w[i].Result) {
			t.Errorf("%s: step %d = %+v, want %+v", what, i, g[i], w[i])
		}
	}
}

func names(s []engine.Step) []string {
	n := make([]string, len(s))
	for i := range s {
		n[i] = s[i].Name
	}
	return n
}

func doneStep(name, result string) engine.Step {
	return engine.Step{Name: name, Fingerprint: "fp-" + name, Done: true, Result: []byte(result)}
}

func testStepsNoneWhenNew(t *testing.T, f fixture) {
	f.stepStore(t)
	c := f.claim(t, f.id("steps-new"), "fp", longLease, longTTL)
	if c.Status != engine.Acquired || len(c.Steps) != 0 {
		t.Errorf("Claim of a new key = %v with %d steps, want acquired with none", c.Status, len(c.Steps))
	}
}

func testStepsOnTakeover(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-takeover")
	tok := f.acquire(t, id, "fp", shortLease, longTTL)
	want := []engine.Step{
		doneStep("charge", `{"id":"ch_1"}`),
		{Name: "email", Fingerprint: "fp-email"}, // started, never finished
	}
	for _, st := range want {
		f.saveStep(t, s, id, tok, st)
	}
	if c := f.claim(t, id, "fp", longLease, longTTL); c.Status != engine.InFlight || len(c.Steps) != 0 {
		t.Errorf("Claim while the lease lives = %v with %d steps, want in flight with none", c.Status, len(c.Steps))
	}
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if c.Abandoned != 1 {
		t.Errorf("takeover Abandoned = %d, want 1", c.Abandoned)
	}
	assertSteps(t, "takeover", c.Steps, want)
	// The new holder records more; the next takeover gets them all.
	more := doneStep("order", "42")
	if err := s.Extend(f.ctx, id, c.Token, shortLease); err != nil {
		t.Fatalf("Extend error = %v", err)
	}
	f.saveStep(t, s, id, c.Token, more)
	c2 := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	assertSteps(t, "second takeover", c2.Steps, append(want, more))
	if c2.Abandoned != 2 {
		t.Errorf("second takeover Abandoned = %d, want 2", c2.Abandoned)
	}
}

func testStepStaleTokenRefused(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-stale")
	old := f.acquire(t, id, "fp", shortLease, longTTL)
	f.saveStep(t, s, id, old, doneStep("a", "1"))
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if err := s.SaveStep(f.ctx, id, old, doneStep("b", "2")); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("SaveStep by the holder that lost its lease error = %v, want ErrLeaseLost", err)
	}
	if err := s.SaveStep(f.ctx, id, old, engine.Step{Name: "a"}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("SaveStep removing a step by the holder that lost its lease error = %v, want ErrLeaseLost", err)
	}
	if err := s.SaveStep(f.ctx, f.id("steps-never-claimed"), c.Token, doneStep("a", "1")); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("SaveStep of an unknown ID error = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	c2 := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	assertSteps(t, "after stale saves", c2.Steps, []engine.Step{doneStep("a", "1")})
	if err := s.Complete(f.ctx, id, c2.Token, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	if err := s.SaveStep(f.ctx, id, c2.Token, doneStep("c", "3")); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("SaveStep after Complete error = %v, want ErrLeaseLost", err)
	}
}

func testStepReleaseKeepsSteps(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-release")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	st := doneStep("charge", "ch_1")
	f.saveStep(t, s, id, tok, st)
	if err := s.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	// The steps belong to the request that recorded them: another one
	// is refused, as after a takeover's release.
	if c := f.claim(t, id, "fp-other", longLease, longTTL); c.Status != engine.InFlight || c.RetryAfter != 0 {
		t.Errorf("Claim with another fingerprint after a release that kept steps = %v (RetryAfter %v), want in flight, RetryAfter 0", c.Status, c.RetryAfter)
	}
	c := f.claim(t, id, "fp", longLease, longTTL)
	if c.Status != engine.Acquired {
		t.Fatalf("Claim after a release that kept steps status = %v, want acquired at once", c.Status)
	}
	if c.Token <= tok {
		t.Errorf("token after Release = %d, want > %d", c.Token, tok)
	}
	if c.Abandoned != 0 {
		t.Errorf("Abandoned after a release = %d, want 0: nobody was lost", c.Abandoned)
	}
	assertSteps(t, "after release", c.Steps, []engine.Step{st})
	if err := s.SaveStep(f.ctx, id, tok, doneStep("x", "")); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("SaveStep by the released holder error = %v, want ErrLeaseLost", err)
	}
	// Released again, and again taken: the steps and the count stay.
	if err := s.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("second Release error = %v", err)
	}
	c = f.claim(t, id, "fp", longLease, longTTL)
	if c.Status != engine.Acquired || c.Abandoned != 0 {
		t.Errorf("Claim after a second release = %v, Abandoned %d, want acquired, 0", c.Status, c.Abandoned)
	}
	assertSteps(t, "after second release", c.Steps, []engine.Step{st})
}

func testStepReleaseOfTakeover(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-release-takeover")
	tok := f.acquire(t, id, "fp", shortLease, longTTL)
	st := doneStep("a", "1")
	f.saveStep(t, s, id, tok, st)
	c := f.awaitAcquired(t, id, "fp", longLease, longTTL)
	if err := s.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	c2 := f.claim(t, id, "fp", longLease, longTTL)
	if c2.Status != engine.Acquired || c2.Abandoned != 1 {
		t.Errorf("Claim after the release of a takeover = %v, Abandoned %d, want acquired, 1", c2.Status, c2.Abandoned)
	}
	assertSteps(t, "after the release of a takeover", c2.Steps, []engine.Step{st})
}

func testStepCompleteDropsSteps(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-complete")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	f.saveStep(t, s, id, tok, doneStep("a", "1"))
	if err := s.Complete(f.ctx, id, tok, sampleResponse(), longTTL); err != nil {
		t.Fatalf("Complete error = %v", err)
	}
	c := f.claim(t, id, "fp", longLease, longTTL)
	if c.Status != engine.Completed {
		t.Fatalf("Claim after Complete status = %v, want completed", c.Status)
	}
	assertResponse(t, c.Response, sampleResponse())
	if in, ok := f.store.(engine.Inspector); ok {
		if r := f.lookup(t, in, id); len(r.Steps) != 0 {
			t.Errorf("Lookup after Complete: %d steps, want none: the response replaces them", len(r.Steps))
		}
	}
}

func testStepReplaceAndRemove(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-replace")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	f.saveStep(t, s, id, tok, engine.Step{Name: "a", Fingerprint: "fp-a"})
	f.saveStep(t, s, id, tok, doneStep("a", "done"))
	f.saveStep(t, s, id, tok, doneStep("b", "2"))
	f.saveStep(t, s, id, tok, doneStep("c", "3"))
	f.saveStep(t, s, id, tok, engine.Step{Name: "c"}) // removes c
	f.saveStep(t, s, id, tok, engine.Step{Name: "z"}) // removes nothing
	if err := s.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	c := f.claim(t, id, "fp", longLease, longTTL)
	assertSteps(t, "after replace and remove", c.Steps, []engine.Step{doneStep("a", "done"), doneStep("b", "2")})
	if in, ok := f.store.(engine.Inspector); ok {
		assertSteps(t, "Lookup", f.lookup(t, in, id).Steps, []engine.Step{doneStep("a", "done"), doneStep("b", "2")})
	}
	// A record whose steps were all removed is released as a new one:
	// the key is new again.
	f.saveStep(t, s, id, c.Token, engine.Step{Name: "a"})
	f.saveStep(t, s, id, c.Token, engine.Step{Name: "b"})
	if err := s.Release(f.ctx, id, c.Token); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	if c := f.claim(t, id, "fp-other", longLease, longTTL); c.Status != engine.Acquired || len(c.Steps) != 0 {
		t.Errorf("Claim with another fingerprint after a release without steps = %v with %d steps, want acquired with none", c.Status, len(c.Steps))
	}
}

func testStepsExpireWithRecord(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-expire")
	tok := f.acquire(t, id, "fp", shortLease, shortTTL)
	f.saveStep(t, s, id, tok, doneStep("a", "1"))
	if err := s.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	// Another fingerprint is refused while the record lives, and gets a
	// new record, without the steps, once it has expired.
	if c := f.claim(t, id, "fp-other", longLease, longTTL); c.Status != engine.InFlight {
		t.Errorf("Claim with another fingerprint after a release that kept steps = %v, want in flight", c.Status)
	}
	c := f.awaitAcquired(t, id, "fp-other", longLease, longTTL)
	if c.Abandoned != 0 || len(c.Steps) != 0 {
		t.Errorf("Claim after the record expired: Abandoned %d, %d steps; want a new record", c.Abandoned, len(c.Steps))
	}
}

func testStepLimits(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-limits")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	name := "big"
	fp := "fp-big"
	full := engine.Step{Name: name, Fingerprint: fp, Done: true, Result: bytes.Repeat([]byte{0xfe}, maxStepSize-len(name)-len(fp))}
	f.saveStep(t, s, id, tok, full)
	over := full
	over.Result = append(slices.Clone(full.Result), 1)
	over.Name = "bigger"
	if err := s.SaveStep(f.ctx, id, tok, over); !errors.Is(err, engine.ErrNotStorable) {
		t.Errorf("SaveStep of %d bytes error = %v, want ErrNotStorable", maxStepSize+len(over.Name)-len(name)+1, err)
	}
	for i := 1; i < maxSteps; i++ {
		f.saveStep(t, s, id, tok, doneStep(fmt.Sprintf("s%03d", i), "x"))
	}
	if err := s.SaveStep(f.ctx, id, tok, doneStep("one-too-many", "x")); !errors.Is(err, engine.ErrNotStorable) {
		t.Errorf("SaveStep of step %d error = %v, want ErrNotStorable", maxSteps+1, err)
	}
	// At the limit a step is still replaced, and removed.
	f.saveStep(t, s, id, tok, doneStep("s001", "again"))
	f.saveStep(t, s, id, tok, engine.Step{Name: "s002"})
	f.saveStep(t, s, id, tok, doneStep("fits-now", "y"))
	if err := s.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	c := f.claim(t, id, "fp", longLease, longTTL)
	if len(c.Steps) != maxSteps {
		t.Fatalf("Claim returned %d steps, want %d", len(c.Steps), maxSteps)
	}
	for _, st := range c.Steps {
		switch st.Name {
		case name:
			if !bytes.Equal(st.Result, full.Result) {
				t.Errorf("step of %d bytes came back as %d bytes", maxStepSize, len(st.Result))
			}
		case "s001":
			if string(st.Result) != "again" {
				t.Errorf("replaced step at the limit = %q, want %q", st.Result, "again")
			}
		case "s002", "one-too-many", "bigger":
			t.Errorf("step %q is kept, want it gone or refused", st.Name)
		}
	}
}

func testStepConcurrentSaves(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-concurrent")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	const n = 20
	var want []engine.Step
	for i := range n {
		want = append(want, doneStep(fmt.Sprintf("step-%02d", i), fmt.Sprint(i)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, st := range want {
		wg.Go(func() {
			if err := s.SaveStep(f.ctx, id, tok, st); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent SaveStep error = %v", err)
	}
	if err := s.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	assertSteps(t, "after concurrent saves", f.claim(t, id, "fp", longLease, longTTL).Steps, want)
}

func testStepBinaryRoundTrip(t *testing.T, f fixture) {
	s := f.stepStore(t)
	id := f.id("steps-binary")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	want := []engine.Step{
		{Name: "bytes", Fingerprint: "fp", Done: true, Result: all},
		{Name: "empty", Fingerprint: "fp-empty", Done: true, Result: []byte{}},
		{Name: "ünïcødé 名前 \"quoted\" 'x' \\ {} [] %s", Fingerprint: "fp+/=", Done: true, Result: []byte(`{"a":"\u0000"}`)},
		{Name: strings.Repeat("n", 255), Fingerprint: strings.Repeat("f", 64)},
	}
	for _, st := range want {
		f.saveStep(t, s, id, tok, st)
	}
	if err := s.Release(f.ctx, id, tok); err != nil {
		t.Fatalf("Release error = %v", err)
	}
	assertSteps(t, "binary round trip", f.claim(t, id, "fp", longLease, longTTL).Steps, want)
}

func testStepResolveDropsSteps(t *testing.T, f fixture) {
	s := f.stepStore(t)
	in := f.inspector(t)
	id := f.id("steps-resolve")
	tok := f.acquire(t, id, "fp", longLease, longTTL)
	st := doneStep("a", "1")
	f.saveStep(t, s, id, tok, st)
	assertSteps(t, "Lookup in flight", f.lookup(t, in, id).Steps, []engine.Step{st})
	if err := in.Resolve(f.ctx, id, resolvedResponse(), longTTL); err != nil {
		t.Fatalf("Resolve error = %v", err)
	}
	if r := f.lookup(t, in, id); len(r.Steps) != 0 {
		t.Errorf("Lookup after Resolve: %d steps, want none", len(r.Steps))
	}
	if err := s.SaveStep(f.ctx, id, tok, doneStep("b", "2")); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("SaveStep after Resolve error = %v, want ErrLeaseLost", err)
	}
	// Resolve forgetting the record forgets its steps.
	id2 := f.id("steps-resolve-forget")
	tok2 := f.acquire(t, id2, "fp", longLease, longTTL)
	f.saveStep(t, s, id2, tok2, st)
	if err := in.Resolve(f.ctx, id2, nil, longTTL); err != nil {
		t.Fatalf("Resolve(nil) error = %v", err)
	}
	if c := f.claim(t, id2, "fp", longLease, longTTL); c.Status != engine.Acquired || len(c.Steps) != 0 || c.Abandoned != 0 {
		t.Errorf("Claim after Resolve(nil) = %v, %d steps, Abandoned %d; want a new record", c.Status, len(c.Steps), c.Abandoned)
	}
}
