package sqlrecord

import (
	"bytes"
	"errors"
	"fmt"
	stepLimits "github.com/idemkit/idempotency/internal/steps"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/engine"
)

// equalSteps compares step lists in order, results by bytes.Equal.
func equalSteps(a, b []engine.Step) bool {
	return slices.EqualFunc(a, b, func(x, y engine.Step) bool {
		return x.Name == y.Name && x.Fingerprint == y.Fingerprint && x.Done == y.Done && bytes.Equal(x.Result, y.Result)
	})
}

func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestStepsRoundTrip(t *testing.T) {
	for _, steps := range [][]engine.Step{
		nil,
		{{Name: "a", Fingerprint: "fp"}},
		{
			{Name: "charge", Fingerprint: "fp-charge", Done: true, Result: []byte(`{"id":"ch_1"}`)},
			{Name: "email", Fingerprint: "fp-email"},
			{Name: "bytes", Fingerprint: "\x00\xff", Done: true, Result: allBytes()},
			{Name: "empty", Fingerprint: "f", Done: true, Result: []byte{}},
			{Name: "", Fingerprint: "f", Done: true},
			{Name: strings.Repeat("n", 255), Fingerprint: strings.Repeat("f", 64), Done: true, Result: make([]byte, 70000)},
		},
	} {
		b := EncodeSteps(steps)
		if len(steps) == 0 && b != nil {
			t.Errorf("EncodeSteps(none) = %x, want nil", b)
		}
		got, err := DecodeSteps(b)
		if err != nil || !equalSteps(got, steps) {
			t.Errorf("DecodeSteps(EncodeSteps(%d steps)) = %d steps, %v; want them back", len(steps), len(got), err)
		}
		for _, st := range got {
			if st.Done && st.Result == nil {
				t.Errorf("DecodeSteps: step %q is done with a nil result", st.Name)
			}
		}
	}
}

// The log, as the stores append to it: the last entry of a name wins, in
// the place of the name's first entry.
func TestStepsLog(t *testing.T) {
	var log []byte
	for _, st := range []engine.Step{
		{Name: "a", Fingerprint: "fa"},
		{Name: "b", Fingerprint: "fb", Done: true, Result: []byte("1")},
		{Name: "a", Fingerprint: "fa", Done: true, Result: []byte("done")},
		{Name: "c", Fingerprint: "fc"},
		{Name: "b", Fingerprint: "fb2", Done: true, Result: []byte("2")},
	} {
		log = AppendStep(log, st)
	}
	want := []engine.Step{
		{Name: "a", Fingerprint: "fa", Done: true, Result: []byte("done")},
		{Name: "b", Fingerprint: "fb2", Done: true, Result: []byte("2")},
		{Name: "c", Fingerprint: "fc"},
	}
	got, err := DecodeSteps(log)
	if err != nil || !equalSteps(got, want) {
		t.Fatalf("DecodeSteps(log) = %+v, %v; want %+v", got, err, want)
	}
	if c := EncodeSteps(got); len(c) >= len(log) {
		t.Errorf("compacted log of %d bytes, want fewer than the log's %d", len(c), len(log))
	}
}

func TestStepsCorrupt(t *testing.T) {
	valid := EncodeSteps([]engine.Step{{Name: "a", Fingerprint: "f", Done: true, Result: []byte("r")}})
	for name, b := range map[string][]byte{
		"unknown tag":        {3, 1, 'a', 1, 'f', 0},
		"tag zero":           {0},
		"truncated":          valid[:len(valid)-1],
		"tag alone":          {stepDone},
		"trailing byte":      append(slices.Clone(valid), stepDone),
		"empty fingerprint":  {stepDone, 1, 'a', 0, 0},
		"overlong name":      {stepDone, 5, 'a'},
		"overlong result":    {stepDone, 1, 'a', 1, 'f', 0xff, 0xff, 0xff, 0xff, 0x0f},
		"unfinished varint":  {stepStarted, 0x80},
		"varint over 64 bit": {stepStarted, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		if steps, err := DecodeSteps(b); !errors.Is(err, ErrCorruptSteps) {
			t.Errorf("DecodeSteps(%s) = %+v, %v; want ErrCorruptSteps", name, steps, err)
		}
	}
}

func TestCheckStep(t *testing.T) {
	full := engine.Step{Name: "n", Fingerprint: "f", Done: true, Result: make([]byte, stepLimits.MaxSize-2)}
	if err := CheckStep(full); err != nil {
		t.Errorf("CheckStep(%d bytes) = %v, want nil", stepLimits.MaxSize, err)
	}
	// Its entry adds a tag and three lengths of 3 bytes at most: the most
	// a log holds, stepLimits.MaxSteps entries, takes under 6.6 MB.
	if n, most := len(AppendStep(nil, full)), stepLimits.MaxSize+10; n > most {
		t.Errorf("entry of a step of %d bytes takes %d bytes, over %d", stepLimits.MaxSize, n, most)
	}
	full.Result = append(full.Result, 0)
	if err := CheckStep(full); !errors.Is(err, engine.ErrNotStorable) {
		t.Errorf("CheckStep(%d bytes) = %v, want ErrNotStorable", stepLimits.MaxSize+1, err)
	}
}

func TestApplyStep(t *testing.T) {
	a := engine.Step{Name: "a", Fingerprint: "fa"}
	b := engine.Step{Name: "b", Fingerprint: "fb", Done: true, Result: []byte("1")}
	steps := []engine.Step{a, b}
	aDone := engine.Step{Name: "a", Fingerprint: "fa", Done: true, Result: []byte("x")}
	c := engine.Step{Name: "c", Fingerprint: "fc"}
	for _, tc := range []struct {
		name    string
		st      engine.Step
		want    []engine.Step
		changed bool
	}{
		{"replace", aDone, []engine.Step{aDone, b}, true},
		{"add", c, []engine.Step{a, b, c}, true},
		{"remove", engine.Step{Name: "a"}, []engine.Step{b}, true},
		{"remove absent", engine.Step{Name: "z"}, steps, false},
	} {
		got, changed, err := ApplyStep(steps, tc.st)
		if err != nil || changed != tc.changed || !equalSteps(got, tc.want) {
			t.Errorf("ApplyStep(%s) = %+v, %v, %v; want %+v, %v", tc.name, got, changed, err, tc.want, tc.changed)
		}
		if !equalSteps(steps, []engine.Step{a, b}) {
			t.Fatalf("ApplyStep(%s) modified its input: %+v", tc.name, steps)
		}
	}
	full := make([]engine.Step, stepLimits.MaxSteps)
	for i := range full {
		full[i] = engine.Step{Name: fmt.Sprint(i), Fingerprint: "f"}
	}
	if _, _, err := ApplyStep(full, c); !errors.Is(err, engine.ErrNotStorable) {
		t.Errorf("ApplyStep of step %d error = %v, want ErrNotStorable", stepLimits.MaxSteps+1, err)
	}
	for _, st := range []engine.Step{{Name: "7", Fingerprint: "g"}, {Name: "7"}} {
		if _, changed, err := ApplyStep(full, st); err != nil || !changed {
			t.Errorf("ApplyStep(%+v) at the limit = %v, %v; want it changed", st, changed, err)
		}
	}
}

// Decoding never panics, whatever the bytes; what decodes re-encodes to
// the same steps; and appending an entry to a log that decodes records the
// step as ApplyStep does.
func FuzzDecodeSteps(f *testing.F) {
	f.Add(EncodeSteps([]engine.Step{{Name: "a", Fingerprint: "f", Done: true, Result: []byte("r")}, {Name: "b", Fingerprint: "g"}}), "a", "f2", true, []byte("x"))
	f.Add([]byte{}, "n", "f", false, []byte(nil))
	f.Add([]byte{stepDone, 0x80}, "", "f", true, allBytes())
	f.Fuzz(func(t *testing.T, b []byte, name, fp string, done bool, result []byte) {
		steps, err := DecodeSteps(b)
		if err != nil {
			return
		}
		again, err := DecodeSteps(EncodeSteps(steps))
		if err != nil || !equalSteps(again, steps) {
			t.Fatalf("DecodeSteps(%x) = %+v, which re-encodes to %+v, %v", b, steps, again, err)
		}
		if fp == "" {
			return
		}
		st := engine.Step{Name: name, Fingerprint: fp, Done: done, Result: result}
		if result == nil {
			st.Result = []byte{}
		}
		got, err := DecodeSteps(AppendStep(slices.Clone(b), st))
		if err != nil {
			t.Fatalf("DecodeSteps of a log with an entry appended: %v", err)
		}
		i := slices.IndexFunc(steps, func(s engine.Step) bool { return s.Name == name })
		want := slices.Clone(steps)
		if i >= 0 {
			want[i] = st
		} else {
			want = append(want, st)
		}
		if !equalSteps(got, want) {
			t.Fatalf("appending %+v to %x decodes to %+v, want %+v", st, b, got, want)
		}
	})
}

// A record in flight reports its steps, and a count of lost holders not
// below 0 (a creator's release that kept steps stores -1); a completed
// one reports its response, and no steps, whatever its column holds.
func TestRecordSteps(t *testing.T) {
	id := engine.ID{Key: "k"}
	steps := []engine.Step{{Name: "a", Fingerprint: "f", Done: true, Result: []byte("1")}}
	rec, err := Row{Abandoned: -1, Steps: EncodeSteps(steps)}.Record(id)
	if err != nil || rec.Abandoned != 0 || !equalSteps(rec.Steps, steps) {
		t.Errorf("Record() in flight = Abandoned %d, steps %+v, %v; want 0, %+v", rec.Abandoned, rec.Steps, err, steps)
	}
	rec, err = Row{Completed: true, Status: 201, Steps: EncodeSteps(steps)}.Record(id)
	if err != nil || rec.Response == nil || rec.Steps != nil {
		t.Errorf("Record() completed = response %v, steps %+v, %v; want a response and no steps", rec.Response, rec.Steps, err)
	}
	if _, err := (Row{Steps: []byte{9}}).Record(id); !errors.Is(err, ErrCorruptSteps) {
		t.Errorf("Record() of corrupt steps error = %v, want ErrCorruptSteps", err)
	}
}
