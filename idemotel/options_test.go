package idemotel_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/idemotel"
)

// TestInvalidOptions: each constructor names every invalid option, a nil
// one included, in one joined error, and makes nothing.
func TestInvalidOptions(t *testing.T) {
	opts := []idemotel.Option{nil, idemotel.WithMeterProvider(nil), idemotel.WithTracerProvider(nil)}
	check := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		lines := strings.Split(err.Error(), "\n")
		assert.Len(t, lines, 3, "one line per invalid option: %q", err)
		for _, l := range lines {
			assert.True(t, strings.HasPrefix(l, "idemotel: "), "line %q has no package prefix", l)
		}
		assert.Contains(t, err.Error(), "option 0 is nil")
	}
	t.Run("ClientObserver", func(t *testing.T) {
		o, err := idemotel.ClientObserver(opts...)
		check(t, err)
		assert.Nil(t, o)
	})
	t.Run("ServerObserver", func(t *testing.T) {
		o, err := idemotel.ServerObserver(opts...)
		check(t, err)
		assert.Nil(t, o)
	})
	t.Run("RegisterStoreSize", func(t *testing.T) {
		r, err := idemotel.RegisterStoreSize(func(context.Context) (int64, int64, error) { return 0, 0, nil }, opts...)
		check(t, err)
		assert.Nil(t, r)
	})
}
