package once_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/store/memstore"
)

// BenchmarkDo: the function door on memstore, for a first run (a new key
// each time) and for a replay, against calling the function bare.
//
//	go test -run '^$' -bench BenchmarkDo -benchmem ./once/
func BenchmarkDo(b *testing.B) {
	store, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	r, err := once.New(store)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	ctx := context.Background()
	fn := func(context.Context) (int, error) { return 42, nil }
	input := map[string]int{"amount": 1200}

	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fn(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		keys := make([]string, b.N)
		for i := range keys {
			keys[i] = "first-" + strconv.Itoa(b.N) + "-" + strconv.Itoa(i)
		}
		b.ResetTimer()
		for i := range b.N {
			if _, err := once.Do(ctx, r, engine.ID{Scope: "bench", Key: keys[i]}, input, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		id := engine.ID{Scope: "bench", Key: "replay"}
		if _, err := once.Do(ctx, r, id, input, fn); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := once.Do(ctx, r, id, input, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
