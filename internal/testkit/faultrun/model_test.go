package faultrun_test

import (
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idempotency/internal/testkit/faultrun"
)

// op is one attempt on key "k" with body v, sent at call and answered at ret.
func op(client int, v string, call, ret int64, kind faultrun.Kind, id int) porcupine.Operation {
	return porcupine.Operation{
		ClientId: client,
		Input:    faultrun.Call{Key: "k", Variant: v},
		Call:     call,
		Output:   faultrun.Result{Kind: kind, ID: id},
		Return:   ret,
	}
}

const never = 1000 // the return time of an unanswered attempt: after all others

func TestModel(t *testing.T) {
	const (
		created  = faultrun.Created
		replayed = faultrun.Replayed
		conflict = faultrun.Conflict
		mismatch = faultrun.Mismatch
		down     = faultrun.Unavailable
		unknown  = faultrun.Unknown
	)
	for _, tc := range []struct {
		name    string
		history []porcupine.Operation
		ok      bool
	}{
		{"one order, replayed", []porcupine.Operation{
			op(0, "a", 0, 10, created, 1), op(1, "a", 20, 30, replayed, 1),
		}, true},
		{"409 while the original runs, then the replay", []porcupine.Operation{
			op(0, "a", 0, 50, created, 1), op(1, "a", 10, 20, conflict, 0), op(1, "a", 60, 70, replayed, 1),
		}, true},
		{"422 and 409 while in flight", []porcupine.Operation{
			op(0, "a", 0, 50, created, 1), op(1, "b", 10, 15, mismatch, 0), op(2, "a", 20, 25, conflict, 0),
		}, true},
		{"the unanswered attempt made the order", []porcupine.Operation{
			op(0, "a", 0, never, unknown, 0), op(0, "a", 20, 30, replayed, 7),
		}, true},
		{"the unanswered attempt did not", []porcupine.Operation{
			op(0, "a", 0, never, unknown, 0), op(0, "a", 20, 30, created, 7), op(1, "a", 40, 50, replayed, 7),
		}, true},
		{"503 changes nothing", []porcupine.Operation{
			op(0, "a", 0, 10, down, 0), op(0, "a", 20, 30, created, 1), op(1, "a", 40, 50, down, 0),
		}, true},
		{"the other body claimed it first", []porcupine.Operation{
			op(0, "b", 0, 10, created, 1), op(1, "a", 20, 30, mismatch, 0), op(1, "b", 40, 50, replayed, 1),
		}, true},

		{"made twice", []porcupine.Operation{
			op(0, "a", 0, 10, created, 1), op(1, "a", 20, 30, created, 2),
		}, false},
		{"made twice, concurrently", []porcupine.Operation{
			op(0, "a", 0, 30, created, 1), op(1, "a", 10, 20, created, 2),
		}, false},
		{"replay of another order", []porcupine.Operation{
			op(0, "a", 0, 10, created, 1), op(1, "a", 20, 30, replayed, 2),
		}, false},
		{"replays that disagree after an unanswered attempt", []porcupine.Operation{
			op(0, "a", 0, never, unknown, 0), op(1, "a", 20, 30, replayed, 1), op(2, "a", 40, 50, replayed, 2),
		}, false},
		{"replay before any order", []porcupine.Operation{
			op(0, "a", 0, 10, replayed, 1), op(1, "a", 20, 30, created, 1),
		}, false},
		{"409 after the order was made", []porcupine.Operation{
			op(0, "a", 0, 10, created, 1), op(1, "a", 20, 30, conflict, 0),
		}, false},
		{"422 for the same body", []porcupine.Operation{
			op(0, "a", 0, 10, created, 1), op(1, "a", 20, 30, mismatch, 0),
		}, false},
		{"422 that says the other body claimed it, which then did not", []porcupine.Operation{
			op(0, "a", 0, 10, mismatch, 0), op(1, "a", 20, 30, created, 1),
		}, false},
		{"409 for one body, 422 for both", []porcupine.Operation{
			op(0, "a", 0, 10, conflict, 0), op(1, "b", 20, 30, mismatch, 0), op(2, "a", 40, 50, mismatch, 0),
		}, false},
		{"an answer the protocol never gives", []porcupine.Operation{
			op(0, "a", 0, 10, faultrun.Unexpected, 0),
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := porcupine.CheckOperations(faultrun.Model(), tc.history)
			assert.Equal(t, tc.ok, got, "CheckOperations() = %v, want %v", got, tc.ok)
		})
	}
}

func TestModelPartitionsByKey(t *testing.T) {
	// Each key on its own is fine; made once each.
	a := op(0, "a", 0, 10, faultrun.Created, 1)
	b := op(1, "a", 20, 30, faultrun.Created, 2)
	b.Input = faultrun.Call{Key: "other", Variant: "a"}
	assert.True(t, porcupine.CheckOperations(faultrun.Model(), []porcupine.Operation{a, b}))
}
