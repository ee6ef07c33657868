//go:build !oncelanded

package consume_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/server"
)

// storeDoor is the protocol that once.Do runs (claim, refuse in flight, run
// under a renewed lease, store or release), reduced to what these runs
// need, until package once is on main: it lets the harness run on the real
// stores now. refuse takes RefuseAbandoned's part.
func storeDoor(store server.Store, refuse bool) func(consume.Func) (process, error) {
	return func(effect consume.Func) (process, error) {
		cut := &cutStore{inner: store}
		const ttl = 10 * time.Minute
		run := func(ctx context.Context, id server.ID, data []byte) error {
			sum := sha256.Sum256(data)
			fp := hex.EncodeToString(sum[:])
			c, err := cut.Claim(ctx, id, fp, lease, ttl)
			if err != nil {
				return fmt.Errorf("%w: %w", server.ErrStoreUnavailable, err)
			}
			switch c.Status {
			case server.Completed:
				if c.Fingerprint != fp {
					return server.ErrKeyMismatch
				}
				if c.Response.Status != 200 {
					return server.ErrOutcomeUnknown
				}
				return nil
			case server.InFlight:
				return server.ErrInFlight
			}
			if refuse && c.Abandoned > 0 {
				if err := cut.Complete(ctx, id, c.Token, &server.Response{Status: 0}, ttl); err != nil {
					return err
				}
				return server.ErrOutcomeUnknown
			}
			ctx, cancel := context.WithCancel(context.WithValue(ctx, interimLease{}, c.Abandoned))
			var wg sync.WaitGroup
			wg.Go(func() {
				t := time.NewTicker(lease / 3)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						if cut.Extend(ctx, id, c.Token, lease) != nil {
							cancel()
						}
					}
				}
			})
			err = effect(ctx, id, data)
			cancel()
			wg.Wait()
			if err != nil {
				_ = cut.Release(context.Background(), id, c.Token)
				return err
			}
			return cut.Complete(context.Background(), id, c.Token, &server.Response{Status: 200}, ttl)
		}
		return process{run: run, die: cut.kill, stop: func() {}}, nil
	}
}

// TestExactlyOnce: see testExactlyOnce.
func TestExactlyOnce(t *testing.T) { testExactlyOnce(t, storeDoor) }

// TestDeathInsideEffect: see testDeathInsideEffect.
func TestDeathInsideEffect(t *testing.T) { testDeathInsideEffect(t, storeDoor) }
