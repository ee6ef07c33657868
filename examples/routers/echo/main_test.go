package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testkit/exampletest"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAPI checks the API as main serves it, over real loopback connections:
// one order per key and account, replays, refusals, and the protocol checks
// of idemtest.
func TestAPI(t *testing.T) {
	exampletest.Run(t, func(t *testing.T) exampletest.API {
		store, err := memstore.New()
		require.NoError(t, err)
		t.Cleanup(func() { store.Close() })
		book := &book{}
		h, err := newHandler(store, book, demoAccounts())
		require.NoError(t, err)
		return exampletest.API{Handler: h, Orders: book.count}
	})
}
