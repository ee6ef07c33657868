package pgstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/pgstore"
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

// schemaV1 is the second version's: the abandoned column, and still the
// index on expires_at.
const schemaV1 = schemaV0 + `
ALTER TABLE "{{t}}" ADD COLUMN IF NOT EXISTS abandoned integer NOT NULL DEFAULT 0;`

// schemaV2 is the third version's: the sweep_at column and its index, the
// index on expires_at gone, and no steps column.
const schemaV2 = schemaV1 + `
ALTER TABLE "{{t}}" ADD COLUMN IF NOT EXISTS sweep_at timestamptz NOT NULL DEFAULT '-infinity';
CREATE INDEX IF NOT EXISTS "{{t}}_sweep_at_idx" ON "{{t}}" (sweep_at);
DROP INDEX IF EXISTS "{{t}}_expires_at_idx";`

// A table created by an earlier version, with its records, is brought up to
// date by Migrate and served as it was; its records, expired, are swept.
func TestMigrateFromEarlierVersions(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		// missing is a column that the version lacks.
		missing string
	}{
		{"first", schemaV0, "abandoned"},
		{"second", schemaV1, "sweep_at"},
		{"third", schemaV2, "steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			pool := newPool(t)
			table := uniqueName(t, "pgstore_test_v_")
			dropOnCleanup(t, pool, table)
			_, err := pool.Exec(ctx, strings.ReplaceAll(tc.schema, "{{t}}", table))
			require.NoError(t, err)
			ins := `INSERT INTO ` + pgx.Identifier{table}.Sanitize() + ` (scope, key, fingerprint, state, token,
				lease_until, created_at, expires_at, status, headers, body)
				VALUES ($1, $2, 'fp', $3, nextval('` + table + `_token_seq'), now() + $4::interval, now(), now() + $5::interval,
				$6, NULL, $7)`
			done, abandoned, expired := scopeID("completed before"), scopeID("abandoned before"), scopeID("expired before")
			for _, r := range []struct {
				id                   engine.ID
				state, lease, expiry string
				status               any
				body                 []byte
			}{
				{done, "completed", "0", "1 hour", 201, []byte("v0")},
				{abandoned, "in_flight", "-1 minute", "1 hour", nil, nil},
				{expired, "completed", "-1 minute", "-1 second", 200, []byte("old")},
			} {
				_, err = pool.Exec(ctx, ins, []byte(r.id.Scope), []byte(r.id.Key), r.state, r.lease, r.expiry, r.status, r.body)
				require.NoError(t, err)
			}

			s, err := pgstore.New(pool, pgstore.WithTable(table))
			require.NoError(t, err)
			defer s.Close()
			_, err = s.Claim(ctx, scopeID("new before migrate"), "fp", time.Minute, time.Hour)
			if tc.missing != "steps" {
				require.ErrorContains(t, err, `column "sweep_at" of relation`, "a Claim of a new key before Migrate")
			} else {
				require.NoError(t, err, "a Claim of a new key before Migrate, which needs no steps")
			}
			_, err = s.Claim(ctx, abandoned, "fp", time.Minute, time.Hour)
			require.ErrorContains(t, err, "(SQLSTATE 42703)", "a takeover before Migrate: an undefined column")
			require.NoError(t, s.Migrate(ctx))
			require.NoError(t, s.Migrate(ctx), "Migrate of an up-to-date table")
			var oldIndex, newIndex *string
			require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1)::text, to_regclass($2)::text",
				pgx.Identifier{table + "_expires_at_idx"}.Sanitize(), pgx.Identifier{table + "_sweep_at_idx"}.Sanitize()).Scan(&oldIndex, &newIndex))
			assert.Nil(t, oldIndex, "the index on expires_at after Migrate")
			assert.NotNil(t, newIndex, "the index on sweep_at after Migrate")

			c, err := s.Claim(ctx, done, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			require.Equal(t, engine.Completed, c.Status)
			assert.Equal(t, &engine.Response{Status: 201, Body: []byte("v0")}, c.Response)
			c, err = s.Claim(ctx, abandoned, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, engine.Acquired, c.Status)
			assert.Equal(t, 1, c.Abandoned)
			rec, err := s.Lookup(ctx, abandoned)
			require.NoError(t, err)
			assert.Equal(t, 1, rec.Abandoned)
			// The record written before steps existed keeps them now.
			step := engine.Step{Name: "charge", Fingerprint: "fp-charge", Done: true, Result: []byte(`"ch_1"`)}
			require.NoError(t, s.SaveStep(ctx, abandoned, c.Token, step))
			require.NoError(t, s.Release(ctx, abandoned, c.Token))
			c, err = s.Claim(ctx, abandoned, "fp", time.Minute, time.Hour)
			require.NoError(t, err)
			assert.Equal(t, engine.Acquired, c.Status)
			assert.Equal(t, 1, c.Abandoned)
			assert.Equal(t, []engine.Step{step}, c.Steps)

			n, err := s.Sweep(ctx, 10)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "records swept: the expired one written before Migrate")
			_, err = s.Lookup(ctx, done)
			assert.NoError(t, err, "the live record after the sweep")
		})
	}
}
