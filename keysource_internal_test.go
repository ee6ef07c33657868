package idempotency

import (
	"bytes"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeySourceConcurrent(t *testing.T) {
	// Enough keys for every goroutine to cross several refills of the
	// buffer, from a zero keySource.
	var s keySource
	const goroutines, perGoroutine = 100, 200
	keys := make(chan string, goroutines*perGoroutine)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range perGoroutine {
				keys <- s.newKey()
			}
		})
	}
	wg.Wait()
	close(keys)
	distinct := make(map[string]bool)
	for k := range keys {
		u, err := uuid.Parse(k)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(4), u.Version(), "version of %s", k)
		require.Equal(t, uuid.RFC4122, u.Variant(), "variant of %s", k)
		distinct[k] = true
	}
	assert.Len(t, distinct, goroutines*perGoroutine, "distinct keys")
}

func TestKeySourceRead(t *testing.T) {
	var s keySource
	// Reads of odd sizes, one larger than the buffer, so that reads
	// straddle refills.
	var got [][]byte
	for _, n := range []int{13, 4000, 13, 5000, 1, 16} {
		p := make([]byte, n)
		m, err := s.Read(p)
		require.NoError(t, err)
		require.Equal(t, n, m)
		got = append(got, p)
	}
	all := bytes.Join(got, nil)
	// 16 zero bytes in a row from crypto/rand would be a 2^-128 event;
	// here they would mean bytes not filled.
	for i := 0; i+16 <= len(all); i += 16 {
		assert.NotEqual(t, make([]byte, 16), all[i:i+16], "bytes %d to %d", i, i+16)
	}
	// Handed-out bytes are not kept.
	used := s.buf[:len(s.buf)-s.left]
	assert.Equal(t, make([]byte, len(used)), used, "the handed-out part of the buffer")
	assert.NotZero(t, s.left)
}

func BenchmarkNewKey(b *testing.B) {
	b.Run("keySource", func(b *testing.B) {
		var s keySource
		b.ReportAllocs()
		for b.Loop() {
			_ = s.newKey()
		}
	})
	b.Run("uuid.NewRandom", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			u, err := uuid.NewRandom()
			if err != nil {
				b.Fatal(err)
			}
			_ = u.String()
		}
	})
}
