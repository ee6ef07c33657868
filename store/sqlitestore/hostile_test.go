package sqlitestore_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/sqlitestore"
)

// doneContexts are a context already cancelled and one whose deadline has
// passed.
func doneContexts() map[string]context.Context {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	cancel2()
	return map[string]context.Context{"cancelled": cancelled, "past deadline": past}
}

// In transactional mode a Complete or Release whose context is already
// done fails, and still ends the lease's transaction: it does not keep the
// file's write lock, and a Complete that did not commit says so
// (ErrNotCommitted), so that the caller is not told of an effect that
// never committed.
func TestTransactionDoneContext(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "records.db"), sqlitestore.WithTransactions())
	for name, done := range doneContexts() {
		for _, op := range []string{"complete", "release"} {
			id := engine.ID{Scope: name, Key: op}
			tok := acquire(t, s, id, time.Minute)
			var err error
			if op == "complete" {
				err = s.Complete(done, id, tok, created(`{}`), time.Hour)
				assert.ErrorIs(t, err, engine.ErrNotCommitted, "%s: Complete", name)
			} else {
				err = s.Release(done, id, tok)
			}
			require.Error(t, err, "%s: %s with a done context", name, op)
			assert.ErrorIs(t, err, done.Err(), "%s: %s", name, op)
			// The write lock is free: another key is claimed at once.
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := s.Claim(short, engine.ID{Scope: name, Key: op + " other"}, "fp", time.Minute, time.Hour)
			cancel()
			require.NoError(t, err, "%s: a claim after %s with a done context", name, op)
			require.NoError(t, s.Release(ctx, engine.ID{Scope: name, Key: op + " other"}, c.Token))
			// The claim was rolled back: the key is new.
			c, err = s.Claim(ctx, id, "another fp", time.Minute, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, engine.Acquired, c.Status, "%s: the key after %s with a done context", name, op)
			require.NoError(t, s.Release(ctx, id, c.Token))
		}
	}
}

// Calls racing Close either succeed or fail with an error wrapping
// ErrStoreClosed.
func TestCloseInFlight(t *testing.T) {
	for _, tx := range []bool{false, true} {
		var opts []sqlitestore.Option
		if tx {
			opts = append(opts, sqlitestore.WithTransactions())
		}
		s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "records.db"), opts...)
		require.NoError(t, err)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		started := make(chan struct{}, 8)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for i := 0; ; i++ {
					id := engine.ID{Scope: "s", Key: string(rune('a'+g)) + string(rune('0'+i%10))}
					c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
					if err == nil && c.Status == engine.Acquired {
						if i%2 == 0 {
							err = s.Complete(ctx, id, c.Token, created(`{}`), time.Hour)
						} else {
							err = s.Release(ctx, id, c.Token)
						}
					}
					if err == nil {
						_, err = s.Lookup(ctx, id)
						if errors.Is(err, engine.ErrNotFound) {
							err = nil
						}
					}
					if i == 2 {
						started <- struct{}{}
					}
					if err != nil {
						if !errors.Is(err, engine.ErrStoreClosed) {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
						return
					}
				}
			}()
		}
		for range 8 {
			<-started
		}
		require.NoError(t, s.Close())
		wg.Wait()
		for _, err := range errs {
			t.Errorf("transactional=%v: a call racing Close: %v, want nil or ErrStoreClosed", tx, err)
		}
	}
}
