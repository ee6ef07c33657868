package pgstore_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/store/pgstore"
)

// TestNewNamesEveryInvalidOption: New names every invalid option, a nil one
// and a nil logger included, in one joined error, and makes no Store.
func TestNewNamesEveryInvalidOption(t *testing.T) {
	s, err := pgstore.New(newPool(t),
		pgstore.WithTable("1t"),
		nil,
		pgstore.WithLogger(nil),
		pgstore.WithLockTimeout(0),
		pgstore.WithIdleTimeout(-time.Second),
		pgstore.WithSweeper(-time.Second, 10),
	)
	require.Error(t, err)
	assert.Nil(t, s)
	lines := strings.Split(err.Error(), "\n")
	assert.Len(t, lines, 6, "one line per invalid option: %q", err)
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "pgstore: "), "line %q has no package prefix", l)
	}
	for _, want := range []string{"option 1 is nil", "WithLogger", "lock timeout", "idle timeout", "sweep interval", `table name "1t"`} {
		assert.Contains(t, err.Error(), want)
	}

	s, err = pgstore.New(newPool(t), pgstore.WithLogger(slog.New(slog.DiscardHandler)), pgstore.WithSweeper(0, 0))
	require.NoError(t, err)
	s.Close()
}
