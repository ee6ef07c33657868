package main

import (
	"context"
	"errors"

	"github.com/idemkit/idempotency/store/pgstore"
)

// txOrder is the "order" step on PostgreSQL: pending pgstore.RunStep.
func txOrder(ctx context.Context, a *api, s *pgstore.Store, ref string, lines int) (int64, error) {
	return 0, errors.New("pgstore.RunStep is not there yet")
}
