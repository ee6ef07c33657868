-- Idempotency records of github.com/idemkit/idempotency/store/pgstore; its
-- README.md describes every column. Every statement is idempotent.

-- Fencing tokens. CACHE 1 (the default) matters: with a larger cache each
-- session would hand out its own range, and a later lease could get a
-- smaller token than an earlier one.
CREATE SEQUENCE IF NOT EXISTS {{sequence}} AS bigint CACHE 1;

CREATE TABLE IF NOT EXISTS {{table}} (
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
    abandoned    integer     NOT NULL DEFAULT 0,
    sweep_at     timestamptz NOT NULL DEFAULT '-infinity',
    steps        bytea[],
    PRIMARY KEY (scope, key)
);

-- Added after the first version: a table created by an earlier one gains
-- the columns here (a change of the catalog only, since PostgreSQL 11: no
-- rewrite). Rows written before sweep_at existed read '-infinity', which
-- leaves them to the sweep's test of expires_at; steps is NULL in a record
-- that holds none.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS abandoned integer NOT NULL DEFAULT 0;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS sweep_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS steps bytea[];

-- Dropping the table drops its token sequence too.
ALTER SEQUENCE {{sequence}} OWNED BY {{table}}.token;

-- Serves the sweep of expired records. sweep_at is expires_at rounded up
-- to the minute (in flight, the claim's time plus the time to live, up to
-- a lease before expires_at), so that a Complete that moves expires_at by
-- less than the rest of the minute leaves every indexed column as it was,
-- and PostgreSQL makes its UPDATE a HOT one, without new index entries.
CREATE INDEX IF NOT EXISTS {{index}} ON {{table}} (sweep_at);

-- The first versions' index on expires_at, which made every Complete write
-- an index entry.
DROP INDEX IF EXISTS {{oldIndex}};
