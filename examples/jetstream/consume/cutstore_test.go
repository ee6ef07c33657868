package consume_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// cutStore is a process's view of the shared idempotency store: once the
// process is dead (kill), nothing it does reaches the store any more, as
// after a crash. The record it held stays as it left it.
type cutStore struct {
	inner engine.Store
	dead  atomic.Bool
}

var _ engine.Store = (*cutStore)(nil)

func (s *cutStore) kill() { s.dead.Store(true) }

func (s *cutStore) err() error {
	if s.dead.Load() {
		return fmt.Errorf("process died: %w", engine.ErrStoreClosed)
	}
	return nil
}

func (s *cutStore) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	if err := s.err(); err != nil {
		return engine.Claim{}, err
	}
	return s.inner.Claim(ctx, id, fp, lease, ttl)
}

func (s *cutStore) Complete(ctx context.Context, id engine.ID, token engine.Token, resp *engine.Response, ttl time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.inner.Complete(ctx, id, token, resp, ttl)
}

func (s *cutStore) Release(ctx context.Context, id engine.ID, token engine.Token) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.inner.Release(ctx, id, token)
}

func (s *cutStore) Extend(ctx context.Context, id engine.ID, token engine.Token, lease time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.inner.Extend(ctx, id, token, lease)
}
