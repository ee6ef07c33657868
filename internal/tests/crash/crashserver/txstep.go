package main

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/store/pgstore"
)

// txOrder is the "order" step where the records are in PostgreSQL: a
// transactional step, whose order and lines commit with the step's record
// (pgstore.RunStep), or are rolled back with it when the process dies.
func txOrder(ctx context.Context, a *api, s pgstore.Store, ref string, lines int) (int64, error) {
	return pgstore.RunStep(ctx, s, "order", stepInput{Ref: ref, Lines: lines}, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		if err := a.began(ctx, ref, "order"); err != nil {
			return 0, err
		}
		return a.orderRows(ctx, tx, ref, lines)
	})
}
