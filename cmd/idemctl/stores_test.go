package main

// The tests in this file run the command against the real stores, through
// the shared PostgreSQL and Redis servers (see internal/testkit/servicetest).
// They skip, saying so, while pgstore or redisstore does not implement
// engine.Inspector, and run as soon as it does: nothing here needs changing
// then. Run them with
//
//	IDEMPOTENCY_REQUIRE_SERVICES=1 go test -race -count=1 -run 'TestPostgres|TestRedis' -v ./cmd/idemctl/

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// requireInspector skips t until store implements engine.Inspector.
func requireInspector(t *testing.T, store engine.Store) {
	t.Helper()
	if _, ok := store.(engine.Inspector); !ok {
		t.Skipf("%T does not implement engine.Inspector yet: this test runs once it does", store)
	}
}

func TestPostgres(t *testing.T) {
	url := servicetest.PostgresURL(t)
	pool := teststores.PostgresPool(t, 4)
	table := teststores.UniqueName(t, "idemctl_t_")
	store := teststores.PostgresOn(t, pool, table)
	requireInspector(t, store)
	testRealStore(t, store, url, "-table", table)
}

func TestRedis(t *testing.T) {
	url := servicetest.RedisURL(t)
	prefix := teststores.UniqueName(t, "idemctl-t:") + ":"
	store := teststores.RedisOn(t, teststores.RedisClient(t), prefix)
	requireInspector(t, store)
	testRealStore(t, store, url, "-prefix", prefix)
}

// testRealStore looks up a key whose first holder was abandoned and whose
// retry was answered "outcome unknown", resolves it, looks it up again,
// and forgets it, all through the command's own connection to the store.
func testRealStore(t *testing.T, store engine.Store, url string, flags ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := engine.ID{Scope: scope, Key: "order-1"}
	c, err := store.Claim(ctx, id, "fingerprint", 10*time.Millisecond, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	for c.Status != engine.Acquired || c.Abandoned == 0 {
		require.NoError(t, ctx.Err(), "the 10ms lease was never taken over")
		c, err = store.Claim(ctx, id, "fingerprint", time.Minute, time.Hour)
		require.NoError(t, err)
	}
	require.NoError(t, store.Complete(ctx, id, c.Token, outcomeUnknownProblem(), time.Hour))

	var stdout, stderr bytes.Buffer
	cmd := func(args ...string) int {
		stdout.Reset()
		stderr.Reset()
		return run(ctx, append(append(args[:1:1], flags...), args[1:]...), environment{
			stdout: &stdout, stderr: &stderr,
			getenv: func(name string) string {
				if name == envStore {
					return url
				}
				return ""
			},
			open: openStore,
			now:  time.Now,
		})
	}
	require.Equal(t, exitOK, cmd("lookup", "-scope", scope, "order-1"), "stderr: %s", &stderr)
	assert.Contains(t, stdout.String(), "state        outcome unknown")
	assert.Contains(t, stdout.String(), "attempts     2 (1 abandoned")

	require.Equal(t, exitOK, cmd("resolve", "-scope", scope, "-status", "201", "-body", `{"order":1}`, "-header", "Content-Type: application/json", "order-1"), "stderr: %s", &stderr)
	got, err := store.Claim(ctx, id, "fingerprint", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Completed, got.Status)
	assert.Equal(t, http.StatusCreated, got.Response.Status)
	assert.Equal(t, `{"order":1}`, string(got.Response.Body))

	require.Equal(t, exitOK, cmd("lookup", "-scope", scope, "order-1"), "stderr: %s", &stderr)
	assert.Contains(t, stdout.String(), "state        completed")

	require.Equal(t, exitOK, cmd("forget", "-scope", scope, "order-1"), "stderr: %s", &stderr)
	assert.Equal(t, exitNotFound, cmd("lookup", "-scope", scope, "order-1"))
	got, err = store.Claim(ctx, id, "fingerprint", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, engine.Acquired, got.Status)
	assert.Equal(t, 0, got.Abandoned)
}
