package pgstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/pgstore"
)

// schemaV0 is the schema of the package's first version, before the
// abandoned column, with the table's name in place of {{t}}.
const schemaV0 = `CREATE SEQUENCE IF NOT EXISTS "{{t}}_token_seq" AS bigint CACHE 1;
CREATE TABLE IF NOT EXISTS "{{t}}" (
    scope        bytea       NOT NULL,
    key          bytea       NOT NULL,
    fingerprint  bytea       NOT NULL,
    state        text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    token        bigint      NOT NULL,
    lease_until  timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    status       integer,
    headers      bytea,
    body         bytea,
    body_omitted boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (scope, key)
);
ALTER SEQUENCE "{{t}}_token_seq" OWNED BY "{{t}}".token;
CREATE INDEX IF NOT EXISTS "{{t}}_expires_at_idx" ON "{{t}}" (expires_at);`

// A table created by the first version, with its records, is brought up to
// date by Migrate and served as it was.
func TestMigrateFromFirstVersion(t *testing.T) {
	ctx := testContext(t)
	pool := newPool(t)
	table := uniqueName(t, "pgstore_test_v0_")
	dropOnCleanup(t, pool, table)
	_, err := pool.Exec(ctx, strings.ReplaceAll(schemaV0, "{{t}}", table))
	require.NoError(t, err)
	ins := `INSERT INTO ` + pgx.Identifier{table}.Sanitize() + ` (scope, key, fingerprint, state, token,
		lease_until, created_at, expires_at, status, headers, body)
		VALUES ($1, $2, 'fp', $3, nextval('` + table + `_token_seq'), now() + $4::interval, now(), now() + interval '1 hour',
		$5, NULL, $6)`
	done, abandoned := scopeID("completed by v0"), scopeID("abandoned under v0")
	_, err = pool.Exec(ctx, ins, []byte(done.Scope), []byte(done.Key), "completed", "0", 201, []byte("v0"))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, ins, []byte(abandoned.Scope), []byte(abandoned.Key), "in_flight", "-1 minute", nil, nil)
	require.NoError(t, err)

	s, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Claim(ctx, abandoned, "fp", time.Minute, time.Hour)
	require.ErrorContains(t, err, `column "abandoned" does not exist`, "a takeover before Migrate")
	require.NoError(t, s.Migrate(ctx))
	require.NoError(t, s.Migrate(ctx), "Migrate of an up-to-date table")

	c, err := s.Claim(ctx, done, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	require.Equal(t, server.Completed, c.Status)
	assert.Equal(t, &server.Response{Status: 201, Body: []byte("v0")}, c.Response)
	c, err = s.Claim(ctx, abandoned, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, server.Acquired, c.Status)
	assert.Equal(t, 1, c.Abandoned)
	rec, err := s.Lookup(ctx, abandoned)
	require.NoError(t, err)
	assert.Equal(t, 1, rec.Abandoned)
}
