package once_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/once"
)

// TestPermanentErrorOmitted: a permanent error whose message the store
// would not keep is still replayed as a permanent error (it matches
// ErrPermanent, not ErrResultOmitted), and fn does not run again, on every
// store.
func TestPermanentErrorOmitted(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, notStorable{store, 1 << 10})
		ctx := context.Background()
		runs := 0
		declined := once.Permanent(errors.New("card declined: " + strings.Repeat("x", 4<<10)))
		fail := func(context.Context) (int, error) { runs++; return 0, declined }
		_, err := once.Do(ctx, r, id("perm-omitted"), nil, fail)
		require.ErrorIs(t, err, once.ErrPermanent)

		_, err = once.Do(ctx, r, id("perm-omitted"), nil, fail)
		assert.ErrorIs(t, err, once.ErrPermanent, "the stored status says the call failed for good")
		assert.NotErrorIs(t, err, engine.ErrResultOmitted, "an omitted error is no omitted value")
		var stored *once.StoredError
		if assert.ErrorAs(t, err, &stored) {
			assert.True(t, stored.Omitted)
			assert.Empty(t, stored.Message)
		}
		assert.Equal(t, 1, runs)
	})
}

// TestInvalidUTF8: the default codec would replace the bytes of a string
// that is not UTF-8 by U+FFFD, so that two inputs would share a fingerprint
// and a result would change on replay: such an input is refused before fn
// runs, and such a result is recorded without it (ErrResultOmitted), never
// replayed changed. Bytes ([]byte) are kept whole.
func TestInvalidUTF8(t *testing.T) {
	eachStore(t, func(t *testing.T, store engine.Store) {
		r := newRunner(t, store)
		ctx := context.Background()
		runs := 0
		fn := func(context.Context) (string, error) { runs++; return "charged", nil }

		type account struct {
			ID   string
			Tags map[string][]string
		}
		for name, input := range map[string]any{
			"string":    "acct-\xff",
			"field":     account{ID: "acct-\xfe"},
			"map key":   account{ID: "acct", Tags: map[string][]string{"k\xff": nil}},
			"in a list": account{ID: "acct", Tags: map[string][]string{"k": {"ok", "v\xfe"}}},
			"pointer":   &account{ID: "acct-\xfd"},
			"interface": []any{1, "x\xff"},
		} {
			_, err := once.Do(ctx, r, id("utf8-in-"+name), input, fn)
			assert.ErrorContains(t, err, "is not valid UTF-8", name)
		}
		assert.Equal(t, 0, runs, "fn does not run for an input the codec would change")

		// Bytes are bytes: two inputs that differ in one byte are two
		// inputs.
		_, err := once.Do(ctx, r, id("utf8-bytes"), []byte("acct-\xff"), fn)
		require.NoError(t, err)
		_, err = once.Do(ctx, r, id("utf8-bytes"), []byte("acct-\xfe"), fn)
		assert.ErrorIs(t, err, engine.ErrKeyMismatch)
		// Valid UTF-8, U+FFFD included, goes through.
		_, err = once.Do(ctx, r, id("utf8-valid"), "café \ufffd", fn)
		assert.NoError(t, err)

		latin1 := func(context.Context) (string, error) { runs++; return "caf\xe9", nil }
		v, err := once.Do(ctx, r, id("utf8-out"), nil, latin1)
		require.NoError(t, err)
		assert.Equal(t, "caf\xe9", v, "the caller that ran fn gets its value")
		res, err := doResult(ctx, r, id("utf8-out"), nil, latin1)
		assert.ErrorIs(t, err, engine.ErrResultOmitted, "a replay is the original, or an error: got %q", res.Value)
		assert.Equal(t, 3, runs)
	})
}

// TestRejectedObserved: a call refused before any claim (its key or scope
// invalid, its input not encodable, no function) is reported to the
// observer as EventRejected, as the HTTP middleware reports its 400s.
func TestRejectedObserved(t *testing.T) {
	var mu sync.Mutex
	var events []engine.Event
	r := newRunner(t, teststores.Memory(t), once.WithConfig(engine.Config{Observer: func(_ context.Context, e engine.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}}))
	ctx := context.Background()
	fn := func(context.Context) (int, error) { return 1, nil }
	long := strings.Repeat("s", engine.MaxScopeLen+1)
	for _, tc := range []struct {
		name  string
		id    engine.ID
		input any
		fn    func(context.Context) (int, error)
		want  engine.ID // what the event names: nothing of an invalid key or scope
	}{
		{"empty key", engine.ID{Scope: "s"}, nil, fn, engine.ID{}},
		{"long key", engine.ID{Scope: "s", Key: strings.Repeat("k", once.MaxKeyLen+1)}, nil, fn, engine.ID{}},
		{"long scope", engine.ID{Scope: long, Key: "k"}, nil, fn, engine.ID{Key: "k"}},
		{"input not encodable", engine.ID{Scope: "s", Key: "k"}, make(chan int), fn, engine.ID{Scope: "s", Key: "k"}},
		{"input not UTF-8", engine.ID{Scope: "s", Key: "k"}, "\xff", fn, engine.ID{Scope: "s", Key: "k"}},
		{"no function", engine.ID{Scope: "s", Key: "k"}, nil, nil, engine.ID{Scope: "s", Key: "k"}},
	} {
		mu.Lock()
		events = nil
		mu.Unlock()
		_, err := once.Do(ctx, r, tc.id, tc.input, tc.fn)
		require.Error(t, err, tc.name)
		mu.Lock()
		if assert.Len(t, events, 1, tc.name) {
			e := events[0]
			assert.Equal(t, engine.EventRejected, e.Kind, tc.name)
			assert.Equal(t, once.StatusInvalid, e.Status, tc.name)
			assert.Equal(t, tc.want, engine.ID{Scope: e.Scope, Key: e.Key}, tc.name)
			assert.Equal(t, err, e.Err, tc.name)
			assert.False(t, e.Start.IsZero(), tc.name)
		}
		mu.Unlock()
	}
}
