// Package clienttest makes the idempotency Clients of tests, in every
// package and module of the repository that tests one.
package clienttest

import (
	"testing"

	"github.com/idemkit/idempotency"
)

// New returns idempotency.NewClient(opts...), failing tb if the options are
// refused.
func New(tb testing.TB, opts ...idempotency.Option) *idempotency.Client {
	tb.Helper()
	c, err := idempotency.NewClient(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
