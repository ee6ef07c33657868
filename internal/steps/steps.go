// Package steps holds the journal of one protected call's steps: the steps
// its earlier holders recorded, the names this run has used, and how to
// record a step under the call's lease. The engine makes one per call and
// puts it in the work's context; package step and pgstore's transactional
// steps run steps against it. It imports nothing of the module, so that the
// engine and the packages that run steps can all import it.
package steps

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idempotency/internal/sentinel"
)

// Limits on one call's steps, stated in engine.StepStore's documentation;
// every store enforces them.
const (
	// MaxSteps is the most steps one call records.
	MaxSteps = 100
	// MaxSize is the most bytes one step record takes: its name,
	// fingerprint and result together.
	MaxSize = 64 << 10
	// MaxName is the longest step name, in bytes.
	MaxName = 255
)

// ErrNoSteps is step.ErrNoSteps.
var ErrNoSteps = errors.New("no protected call with steps in this context")

// Entry is one recorded step, as the engine's Step.
type Entry struct {
	Name        string
	Fingerprint string
	Done        bool
	Result      []byte
}

// Saver records an entry under the call's lease: fenced by its token,
// bounded by the store timeout, on a context whose values are ctx's.
type Saver interface {
	SaveStep(ctx context.Context, e Entry) error
	// Ended returns why the call's work can begin no more steps (its
	// lease was lost, or the work returned), or nil. A step's context may
	// not say so: a goroutine that outlives the work may hold a context
	// detached from the work's (context.WithoutCancel).
	Ended() error
}

// Codec encodes step inputs and results, as the engine's Codec.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// Journal is the state of one call's steps. It is safe for concurrent use:
// a run may run steps on several goroutines.
type Journal struct {
	// Saver records steps; nil when the store keeps none.
	Saver Saver
	// Codec encodes inputs and results.
	Codec Codec
	// AtMostOnce records each step's start before it runs, so that a
	// step whose holder was lost while it ran is told apart from one
	// that never began.
	AtMostOnce bool
	// Saves is held while a step is recorded: a store that writes steps
	// in the call's own transaction (a Binder's) takes one statement at a
	// time on its connection, steps may run on several goroutines, and
	// the engine takes it to settle the call, after which no step is
	// recorded (Settled).
	Saves sync.Mutex
	// Settled is set, under Saves, once the work has returned and the
	// call is being settled: a step recorded after that would race the
	// call's Complete or Release.
	Settled bool

	mu     sync.Mutex
	loaded []Entry // recorded by earlier holders
	used   map[string]struct{}
}

// Reset readies j for a call whose earlier holders recorded loaded.
func (j *Journal) Reset(saver Saver, codec Codec, atMostOnce bool, loaded []Entry) {
	j.Saver, j.Codec, j.AtMostOnce = saver, codec, atMostOnce
	j.loaded, j.used, j.Settled = loaded, nil, false
}

// ContextKey is the context key under which a *Journal is found.
type ContextKey struct{}

// FromContext returns the journal of the call that ctx belongs to, if its
// store keeps steps.
func FromContext(ctx context.Context) (*Journal, error) {
	j, ok := ctx.Value(ContextKey{}).(*Journal)
	if !ok || j == nil {
		return nil, ErrNoSteps
	}
	if j.Saver == nil {
		return nil, fmt.Errorf("%w: the idempotency store does not keep steps (engine.StepStore)", ErrNoSteps)
	}
	return j, nil
}

// Begin claims name for this run and fingerprints input. It returns the
// step's record from an earlier holder, if there is one with the same
// input. A name used before in this run, an invalid name, too many steps and
// an input that differs from the recorded one are errors, and the step must
// not run.
func (j *Journal) Begin(name string, input any) (fp string, prior *Entry, err error) {
	if err := checkName(name); err != nil {
		return "", nil, err
	}
	in, err := j.marshal(input)
	if err != nil {
		return "", nil, fmt.Errorf("step %q: encoding its input: %w", name, err)
	}
	sum := sha256.Sum256(in)
	fp = base64.RawURLEncoding.EncodeToString(sum[:])
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.used[name]; ok {
		return "", nil, fmt.Errorf("step %q: name already used in this run: name each step of a run once (a loop names its steps by item)", name)
	}
	for i := range j.loaded {
		if j.loaded[i].Name == name {
			prior = &j.loaded[i]
			break
		}
	}
	if prior == nil && len(j.used)+j.recordedOthers() >= MaxSteps {
		return "", nil, fmt.Errorf("step %q: a call records at most %d steps", name, MaxSteps)
	}
	if prior != nil && prior.Fingerprint != fp {
		return "", nil, fmt.Errorf("step %q: its input differs from the one recorded: %w", name, sentinel.ErrKeyMismatch)
	}
	if j.used == nil {
		j.used = make(map[string]struct{}, 4)
	}
	j.used[name] = struct{}{}
	return fp, prior, nil
}

// recordedOthers counts the loaded steps this run has not used yet: they
// take room in the record too. j.mu is held.
func (j *Journal) recordedOthers() int {
	n := 0
	for i := range j.loaded {
		if _, ok := j.used[j.loaded[i].Name]; !ok {
			n++
		}
	}
	return n
}

// checkName refuses a name no store can key a step by.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("step: a step needs a name")
	case len(name) > MaxName:
		return fmt.Errorf("step: name of %d bytes is longer than %d", len(name), MaxName)
	case !utf8.ValidString(name):
		return fmt.Errorf("step %q: name is not valid UTF-8", name)
	}
	for _, r := range name {
		// C0, DEL and C1 (U+0080 to U+009F, whose U+009B is a terminal's
		// CSI): a name is printed where an operator reads it.
		if unicode.IsControl(r) {
			return fmt.Errorf("step %q: name holds a control character", name)
		}
	}
	return nil
}

// The first byte of a recorded result says what follows.
const (
	tagValue   = 'v' // the codec's encoding of the value
	tagOmitted = 'o' // the value was too large to record
)

// Encode returns the result to record for v. A value that the codec
// cannot encode (it fails, or panics), or too large for a step record, is
// recorded as omitted: the step ran, and must not run again.
func (j *Journal) Encode(name, fp string, v any) []byte {
	b, err := j.marshal(v)
	if err != nil || len(name)+len(fp)+1+len(b) > MaxSize {
		return Omitted()
	}
	out := make([]byte, 1+len(b))
	out[0] = tagValue
	copy(out[1:], b)
	return out
}

// Omitted returns the result recorded for a step that ran, without its
// value.
func Omitted() []byte { return []byte{tagOmitted} }

// IsOmitted reports whether result records a step without its value.
func IsOmitted(result []byte) bool { return len(result) == 1 && result[0] == tagOmitted }

// Decode decodes a recorded result into v.
func (j *Journal) Decode(name string, result []byte, v any) error {
	if len(result) == 0 {
		return fmt.Errorf("step %q: its record holds no result", name)
	}
	switch result[0] {
	case tagOmitted:
		return fmt.Errorf("step %q: %w (too large, not encodable, or refused by the store; the step is not run again)", name, sentinel.ErrResultOmitted)
	case tagValue:
		if err := j.unmarshal(result[1:], v); err != nil {
			return fmt.Errorf("step %q: decoding its recorded result: %w", name, err)
		}
		return nil
	}
	return fmt.Errorf("step %q: its record holds a result of unknown form %q", name, result[0])
}

// marshal encodes v with the codec. A codec is the application's (a type's
// own MarshalJSON, under JSON): its panic is an error, so that a step that
// ran is still recorded, and one that did not is refused.
func (j *Journal) marshal(v any) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("the codec panicked: %v", p)
		}
	}()
	return j.Codec.Marshal(v)
}

// unmarshal decodes data into v with the codec, its panic an error.
func (j *Journal) unmarshal(data []byte, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the codec panicked: %v", p)
		}
	}()
	return j.Codec.Unmarshal(data, v)
}

// Forget gives name back, so that the run may use it again: its step did
// not run (it failed before running, or its start could not be recorded).
func (j *Journal) Forget(name string) {
	j.mu.Lock()
	delete(j.used, name)
	j.mu.Unlock()
}
