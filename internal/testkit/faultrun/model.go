package faultrun

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Call is the input of one operation of a history: one attempt to place the
// order named by Key, with one of two bodies (Variant "a" or "b"), which the
// middleware fingerprints apart.
type Call struct {
	Key, Variant string
}

// Kind is what one attempt came to.
type Kind int

const (
	// Created: 201, the order was made by this attempt.
	Created Kind = iota + 1
	// Replayed: 201 with Idempotent-Replayed, the stored answer.
	Replayed
	// Conflict: 409, a request with the key is in flight.
	Conflict
	// Mismatch: 422, the key was used for the other variant.
	Mismatch
	// Unavailable: 503, the store failed; nothing ran.
	Unavailable
	// Unknown: no answer (dropped, reset, timed out) or the proxy's 502:
	// the order may or may not have been made.
	Unknown
	// Unexpected: any other answer, which the protocol never gives here.
	Unexpected
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case Created:
		return "created"
	case Replayed:
		return "replayed"
	case Conflict:
		return "409"
	case Mismatch:
		return "422"
	case Unavailable:
		return "503"
	case Unknown:
		return "unknown"
	case Unexpected:
		return "unexpected"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Result is the output of one operation: what the attempt came to and, for
// Created and Replayed, the order number in the answer.
type Result struct {
	Kind   Kind
	ID     int
	Status int // for Unexpected
}

// keyState is the sequential state of one key: unclaimed; claimed by one
// body (Variant) and in flight; or done, with the number of its order (0
// while the number is not known: the attempt that made it went unanswered).
type keyState struct {
	Variant string // "" while unclaimed
	Done    bool
	ID      int
}

// other returns the variant that is not v.
func other(v string) string {
	if v == "a" {
		return "b"
	}
	return "a"
}

// Model is the sequential specification of the protocol, as a client sees
// it, for one key at a time (histories are partitioned by key), when the API
// behind the middleware answers every request it runs with 201 (so that no
// claim is ever given back).
//
// A key is unclaimed until an attempt claims it for its body; it is in
// flight until that attempt's order is made, and done from then on. An
// attempt that made the order is the one that claimed it (its claim and its
// completion are one step here: the steps of the others that saw the key in
// flight come before it). An attempt with the claiming body is answered 409
// while the key is in flight, and a replay of the order once it is done; an
// attempt with the other body, 422 at any time after the claim. A 503
// changes nothing. An attempt without an answer may have made the order or
// not. So the model forbids exactly what the product promises never
// happens: two attempts that each made the order, a replay of another order
// or before any order, a 409 after the order was made, a 422 for the body
// the key was claimed with, a 409 and a 422 that disagree on that body.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range history {
				k := op.Input.(Call).Key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []any { return []any{keyState{}} },
		Step: func(state, input, output any) []any {
			st, in, out := state.(keyState), input.(Call), output.(Result)
			mine := st.Variant == "" || st.Variant == in.Variant // no other body claimed it
			switch out.Kind {
			case Created:
				if !st.Done && mine {
					return []any{keyState{Variant: in.Variant, Done: true, ID: out.ID}}
				}
			case Replayed:
				if st.Done && st.Variant == in.Variant && (st.ID == 0 || st.ID == out.ID) {
					return []any{keyState{Variant: in.Variant, Done: true, ID: out.ID}}
				}
			case Conflict:
				if !st.Done && mine {
					return []any{keyState{Variant: in.Variant}}
				}
			case Mismatch:
				if st.Variant == "" {
					return []any{keyState{Variant: other(in.Variant)}}
				}
				if st.Variant != in.Variant {
					return []any{st}
				}
			case Unavailable:
				return []any{st}
			case Unknown:
				if !st.Done && mine {
					return []any{st, keyState{Variant: in.Variant, Done: true}}
				}
				return []any{st}
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(Call), output.(Result)
			switch out.Kind {
			case Created, Replayed:
				return fmt.Sprintf("%s(%s) → %v #%d", in.Key, in.Variant, out.Kind, out.ID)
			case Unexpected:
				return fmt.Sprintf("%s(%s) → %d", in.Key, in.Variant, out.Status)
			}
			return fmt.Sprintf("%s(%s) → %v", in.Key, in.Variant, out.Kind)
		},
		DescribeState: func(state any) string {
			switch st := state.(keyState); {
			case st.Variant == "":
				return "unclaimed"
			case !st.Done:
				return st.Variant + " in flight"
			default:
				return fmt.Sprintf("%s done #%d", st.Variant, st.ID)
			}
		},
	}
	return nm.ToModel()
}
