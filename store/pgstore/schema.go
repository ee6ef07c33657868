package pgstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed schema.sql
var schemaTemplate string

// defaultTable is the table a Store uses unless WithTable names another.
const defaultTable = "idempotency_records"

// migrateLockKey is the key of the transaction-level advisory lock
// (pg_advisory_xact_lock) that Migrate holds while it applies the schema, so
// that instances starting together apply it one at a time. A team that runs
// its own migrations alongside Migrate can take the same lock.
const migrateLockKey int64 = 0x69646d6b70677374 // "idmkpgst"

// The sequence and the index take their names from the table's.
const (
	sequenceSuffix = "_token_seq"
	indexSuffix    = "_sweep_at_idx"
	// oldIndexSuffix names the index of the first versions, on
	// expires_at, which Migrate drops. Being the longer suffix, it bounds
	// the table's name, as it did then.
	oldIndexSuffix = "_expires_at_idx"
	// maxIdentifier is PostgreSQL's limit (NAMEDATALEN-1); a longer name is
	// silently truncated, which could make two tables share a sequence.
	maxIdentifier = 63
)

// names are the quoted identifiers of a Store's objects.
type names struct {
	table    string // maybe schema-qualified
	sequence string // in the table's schema
	index    string // never qualified: an index lives in its table's schema
	// indexQualified is index in the table's schema, to look it up.
	indexQualified string
	// oldIndex is the first versions' index, in the table's schema.
	oldIndex string
}

// parseTable checks a table name, "table" or "schema.table", and derives the
// names of the table's sequence and index. Each part must be a plain
// identifier (letters, digits, underscores, not starting with a digit); it is
// quoted, so it is used exactly as given, case included.
func parseTable(name string) (names, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return names{}, fmt.Errorf("pgstore: table name %q: want table or schema.table", name)
	}
	for i, p := range parts {
		limit := maxIdentifier
		if i == len(parts)-1 {
			limit -= len(oldIndexSuffix)
		}
		if !isIdentifier(p) || len(p) > limit {
			return names{}, fmt.Errorf("pgstore: table name %q: each part must be an identifier of "+
				"letters, digits and underscores not starting with a digit, the table at most %d bytes",
				name, maxIdentifier-len(oldIndexSuffix))
		}
	}
	table := parts[len(parts)-1]
	seq := append(parts[:len(parts)-1:len(parts)-1], table+sequenceSuffix)
	idx := append(parts[:len(parts)-1:len(parts)-1], table+indexSuffix)
	old := append(parts[:len(parts)-1:len(parts)-1], table+oldIndexSuffix)
	return names{
		table:          pgx.Identifier(parts).Sanitize(),
		sequence:       pgx.Identifier(seq).Sanitize(),
		index:          pgx.Identifier{table + indexSuffix}.Sanitize(),
		indexQualified: pgx.Identifier(idx).Sanitize(),
		oldIndex:       pgx.Identifier(old).Sanitize(),
	}, nil
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// schema fills in schema.sql, whose placeholders {{table}}, {{sequence}},
// {{index}} and {{oldIndex}} stand for the quoted names.
func (n names) schema() string {
	return strings.NewReplacer(
		"{{table}}", n.table,
		"{{sequence}}", n.sequence,
		"{{index}}", n.index,
		"{{oldIndex}}", n.oldIndex,
	).Replace(schemaTemplate)
}

// Schema returns the SQL that Migrate applies for the given table (see
// "idempotency_records" or the table WithTable names), for teams that run their own migrations. It
// is idempotent and creates the table, the sequence of its fencing tokens and
// the index that serves the sweep; the package's README.md describes each
// column.
func Schema(table string) (string, error) {
	n, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return n.schema(), nil
}

// Migrate implements Store.
func (s *store) Migrate(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	defer rollback(ctx, tx) // after a successful Commit, this does nothing
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.coldMode, migrateLockKey); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	var exists bool
	// The last column added, steps, and the index on sweep_at, with the
	// first versions' index gone, tell a table of this version from an
	// earlier one, which Schema's statements bring up to date.
	err = tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL
		AND to_regclass($3) IS NOT NULL AND to_regclass($4) IS NULL
		AND EXISTS (SELECT 1 FROM pg_attribute
			WHERE attrelid = to_regclass($1) AND attname = 'steps' AND NOT attisdropped)`, s.coldMode,
		s.names.table, s.names.sequence, s.names.indexQualified, s.names.oldIndex).Scan(&exists)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if exists {
		return nil
	}
	// Without arguments pgx sends the script with the simple protocol, which
	// runs several statements in one message.
	if _, err := tx.Exec(ctx, s.names.schema()); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}
