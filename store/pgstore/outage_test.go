package pgstore_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/store/pgstore"
)

// TestOutage cuts the database off, in the two ways it goes away, and checks
// that every operation fails promptly with a store error, never
// ErrLeaseLost, that no error shows the password, and that the store works
// again once the database is back.
func TestOutage(t *testing.T) {
	ctx := testContext(t)
	direct := newPool(t)
	_, table := newStore(t, direct) // the table outlives the proxy

	cfg := poolConfig(t)
	p, err := faultnet.StartTCP(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	_, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	n, err := strconv.ParseUint(port, 10, 16)
	require.NoError(t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(n)
	// The test server trusts loopback and ignores the password; an error
	// message must never show it.
	const secret = "pw-that-must-not-leak-7f3a"
	cfg.ConnConfig.Password = secret
	cfg.MaxConns = 4
	pool := connect(t, cfg)
	s, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	defer s.Close()

	id := scopeID("outage")
	tok := acquire(t, ctx, s, id, "fp")
	ops := []struct {
		name string
		call func(context.Context) error
	}{
		{"Claim", func(ctx context.Context) error {
			_, err := s.Claim(ctx, scopeID("new"), "fp", time.Minute, time.Hour)
			return err
		}},
		{"Claim of the held key", func(ctx context.Context) error {
			_, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			return err
		}},
		{"Extend", func(ctx context.Context) error { return s.Extend(ctx, id, tok, time.Minute) }},
		{"Complete", func(ctx context.Context) error { return s.Complete(ctx, id, tok, created(`{}`), time.Hour) }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, id, tok) }},
		{"Sweep", func(ctx context.Context) error { _, err := s.Sweep(ctx, 10); return err }},
		{"Migrate", func(ctx context.Context) error { return s.Migrate(ctx) }},
	}
	for _, tc := range []struct {
		name     string
		cut      func()
		deadline time.Duration
	}{
		{"server down", p.Cut, 5 * time.Second},
		{"partition", p.Blackhole, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cut()
			defer p.Heal()
			for _, op := range ops {
				opCtx, cancel := context.WithTimeout(ctx, tc.deadline)
				start := time.Now()
				err := op.call(opCtx)
				elapsed := time.Since(start)
				cancel()
				t.Logf("%s: %v after %v", op.name, err, elapsed.Round(time.Millisecond))
				if !assert.Error(t, err, "%s during the outage", op.name) {
					continue
				}
				assert.NotErrorIs(t, err, engine.ErrLeaseLost, "%s error", op.name)
				assert.True(t, strings.HasPrefix(err.Error(), "pgstore: "), "%s error %q lacks the prefix", op.name, err)
				assert.NotContains(t, err.Error(), secret, "%s error shows the password", op.name)
				assert.Less(t, elapsed, tc.deadline+time.Second, "%s took %v with a deadline of %v", op.name, elapsed, tc.deadline)
			}
		})
	}

	// Back: the lease survived the outage, and its holder completes it. The
	// pool may hand out a connection that died in the outage once, so the
	// first call may fail.
	eventually(t, 10*time.Second, "Extend after the outage", func() bool {
		return s.Extend(ctx, id, tok, time.Minute) == nil
	})
	require.NoError(t, s.Complete(ctx, id, tok, created(`{"after":"outage"}`), time.Hour))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Completed, c.Status)
}
