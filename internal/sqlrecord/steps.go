package sqlrecord

import (
	"encoding/binary"
	"errors"
	"fmt"
	stepLimits "github.com/idemkit/idempotency/internal/steps"
	"slices"

	"github.com/idemkit/idempotency/engine"
)

// A record's steps are kept in one BLOB column as a log: a concatenation of
// entries, each a tag byte (stepStarted or stepDone), then the name, the
// fingerprint and the result, each as an unsigned varint length and its
// bytes. An entry replaces every earlier entry of its name, so that a
// store records a step by appending its entry to the column in one
// statement, without reading the column first (CONCAT in MySQL, || in
// SQLite); it counts the entries beside them, and when the log would hold
// more than stepLimits.MaxSteps entries, or a step is removed, it rewrites the
// log compacted (EncodeSteps), one entry per step. The log holds no entry
// with an empty fingerprint (a removal is a rewrite), so a record holds
// steps when, and only when, its log is not empty; an empty log is kept as
// NULL.
//
// The tags are the format's version too: another format would use others.
const (
	stepStarted = 1
	stepDone    = 2
)

// ErrCorruptSteps is returned by DecodeSteps for bytes that the encoding
// did not write.
var ErrCorruptSteps = errors.New("corrupt stored steps")

// CheckStep refuses a step that no record keeps: one over
// stepLimits.MaxSize bytes.
func CheckStep(st engine.Step) error {
	if n := len(st.Name) + len(st.Fingerprint) + len(st.Result); n > stepLimits.MaxSize {
		return fmt.Errorf("step %q of %d bytes, over %d: %w", st.Name, n, stepLimits.MaxSize, engine.ErrNotStorable)
	}
	return nil
}

// AppendStep appends the log entry of st, whose Fingerprint is not empty,
// to b.
func AppendStep(b []byte, st engine.Step) []byte {
	tag := byte(stepStarted)
	if st.Done {
		tag = stepDone
	}
	b = slices.Grow(b, 1+3*binary.MaxVarintLen32+len(st.Name)+len(st.Fingerprint)+len(st.Result))
	b = append(b, tag)
	b = binary.AppendUvarint(b, uint64(len(st.Name)))
	b = append(b, st.Name...)
	b = binary.AppendUvarint(b, uint64(len(st.Fingerprint)))
	b = append(b, st.Fingerprint...)
	b = binary.AppendUvarint(b, uint64(len(st.Result)))
	return append(b, st.Result...)
}

// EncodeSteps encodes steps as a compacted log, one entry each; nil for
// none.
func EncodeSteps(steps []engine.Step) []byte {
	if len(steps) == 0 {
		return nil
	}
	size := 0
	for _, st := range steps {
		size += 1 + 3*binary.MaxVarintLen32 + len(st.Name) + len(st.Fingerprint) + len(st.Result)
	}
	b := make([]byte, 0, size)
	for _, st := range steps {
		b = AppendStep(b, st)
	}
	return b
}

// DecodeSteps decodes a log: the steps it holds, each as its last entry
// left it, in the order their names first appear; nil for none. Each
// Result is a copy, never nil for a step that is done.
func DecodeSteps(b []byte) ([]engine.Step, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var (
		steps []engine.Step
		index map[string]int
	)
	d := headerDecoder{b: b}
	for len(d.b) > 0 && d.err == nil {
		tag := d.b[0]
		d.b = d.b[1:]
		if tag != stepStarted && tag != stepDone {
			return nil, ErrCorruptSteps
		}
		st := engine.Step{Done: tag == stepDone}
		st.Name = d.string()
		st.Fingerprint = d.string()
		st.Result = d.bytes()
		if d.err != nil || st.Fingerprint == "" {
			return nil, ErrCorruptSteps
		}
		if index == nil {
			index = make(map[string]int)
		}
		if i, ok := index[st.Name]; ok {
			steps[i] = st
			continue
		}
		index[st.Name] = len(steps)
		steps = append(steps, st)
	}
	if d.err != nil {
		return nil, ErrCorruptSteps
	}
	return steps, nil
}

// ApplyStep returns steps with st recorded: it replaces the step of the
// same name, or removes it when st.Fingerprint is empty. It refuses, with
// an error wrapping engine.ErrNotStorable, to make steps hold more than
// stepLimits.MaxSteps. changed is false when steps stay as they were (the
// removal of a step that is not there). steps is not modified.
func ApplyStep(steps []engine.Step, st engine.Step) (out []engine.Step, changed bool, err error) {
	i := slices.IndexFunc(steps, func(s engine.Step) bool { return s.Name == st.Name })
	switch {
	case st.Fingerprint == "" && i < 0:
		return steps, false, nil
	case st.Fingerprint == "":
		return slices.Delete(slices.Clone(steps), i, i+1), true, nil
	case i >= 0:
		out = slices.Clone(steps)
		out[i] = st
		return out, true, nil
	case len(steps) >= stepLimits.MaxSteps:
		return nil, false, fmt.Errorf("step %q: more than %d steps: %w", st.Name, stepLimits.MaxSteps, engine.ErrNotStorable)
	}
	return append(slices.Clip(steps), st), true, nil
}

// bytes reads a length and that many bytes, copied.
func (d *headerDecoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = ErrCorruptHeader
		return nil
	}
	b := make([]byte, n)
	copy(b, d.b)
	d.b = d.b[n:]
	return b
}
