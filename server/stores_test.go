package server_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/store/memstore"
)

func faulty(t *testing.T) (*faultstore.Store, memstore.Store) {
	t.Helper()
	mem, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	return faultstore.New(mem), mem
}

var errFlaky = errors.New("store timed out")

// failing is a Store whose every operation fails.
type failing struct{ engine.Store }

var errDown = errors.New("store down")

func (failing) Claim(context.Context, engine.ID, string, time.Duration, time.Duration) (engine.Claim, error) {
	return engine.Claim{}, errDown
}

// losing is a store whose Extend reports the lease lost.
type losing struct{ memstore.Store }

func (losing) Extend(context.Context, engine.ID, engine.Token, time.Duration) error {
	return fmt.Errorf("losing: %w", engine.ErrLeaseLost)
}
