package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/store/pgstore"
)

// postgresBench runs pgstore on a table of its own, on the PostgreSQL server
// that IDEMPOTENCY_POSTGRES_URL names. The CPU time it reports is that of
// the backends serving its pool, read from /proc when the server runs on
// this machine: the server's background processes (WAL writer,
// checkpointer, autovacuum) serve everyone on a shared server and are not
// counted.
type postgresBench struct {
	replayKey string
	table     string
	pool      *pgxpool.Pool
	admin     *pgx.Conn
	store     pgstore.Store
	h         http.Handler
	wire      *wire
	backends  *procCPU
	// statements says whether pg_stat_statements can be read.
	statements bool
	// prefilled is how many prefilled records the table holds.
	prefilled int
	version   string
}

func newPostgresBench(ctx context.Context, replayKey string, poolSize int, syncCommit string) (*postgresBench, error) {
	url := os.Getenv("IDEMPOTENCY_POSTGRES_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The URL may hold a password: do not print it.
		return nil, errors.New("loadbench: IDEMPOTENCY_POSTGRES_URL is not a valid URL")
	}
	adminCfg := cfg.ConnConfig.Copy()
	p := &postgresBench{
		replayKey: replayKey,
		table:     "idempotency_loadbench_" + randomHex(4),
		wire:      &wire{},
		backends:  newProcCPU(),
	}
	cfg.MaxConns = int32(poolSize)
	cfg.ConnConfig.DialFunc = p.wire.dial
	if syncCommit != "" {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = syncCommit
	}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		if pid := int(c.PgConn().PID()); isProcess(pid, "postgres") {
			p.backends.add(pid)
		}
		return nil
	}
	if p.admin, err = pgx.ConnectConfig(ctx, adminCfg); err != nil {
		return nil, fmt.Errorf("loadbench: postgres: %w", err)
	}
	if p.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		p.admin.Close(ctx)
		return nil, fmt.Errorf("loadbench: postgres: %w", err)
	}
	if p.store, err = pgstore.New(p.pool, pgstore.WithTable(p.table)); err == nil {
		err = p.store.Migrate(ctx)
	}
	if err == nil {
		p.h, err = newMiddleware(p.store)
	}
	if err == nil {
		err = p.admin.QueryRow(ctx, "SHOW server_version").Scan(&p.version)
	}
	if err == nil {
		err = warmPool(ctx, p.pool, poolSize)
	}
	if err == nil {
		err = seedReplay(p.h, replayKey)
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("loadbench: postgres: %w", err)
	}
	var n int64
	p.statements = p.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n) == nil
	return p, nil
}

// isProcess reports whether pid is a process of this machine named name.
func isProcess(pid int, name string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && strings.HasPrefix(string(b), name)
}

// warmPool opens the pool's connections now, so that no phase pays for
// them.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

func (p *postgresBench) name() string { return benchreport.Postgres }

func (p *postgresBench) ident() string { return pgx.Identifier{p.table}.Sanitize() }

// copyRecords inserts copies of the replayed key's record under the keys
// prefill-(from) to prefill-(to), with the columns in replace set to the
// expressions given instead. The copy names only the columns key and scope,
// so that it keeps up with the schema.
func (p *postgresBench) copyRecords(ctx context.Context, from, to int, replace map[string]string) error {
	rows, err := p.admin.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, p.table)
	if err != nil {
		return err
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var names, values []string
	for _, c := range cols {
		names = append(names, pgx.Identifier{c}.Sanitize())
		v := pgx.Identifier{c}.Sanitize()
		if c == "key" {
			v = `convert_to('prefill-' || g, 'UTF8')`
		} else if r, ok := replace[c]; ok {
			v = r
		}
		values = append(values, v)
	}
	const chunk = 100_000
	for lo := from; lo <= to; lo += chunk {
		hi := min(to, lo+chunk-1)
		_, err := p.admin.Exec(ctx, "INSERT INTO "+p.ident()+" ("+strings.Join(names, ", ")+") SELECT "+
			strings.Join(values, ", ")+" FROM "+p.ident()+", generate_series($2::int, $3::int) AS g"+
			" WHERE scope = ''::bytea AND key = $1::bytea", []byte(p.replayKey), lo, hi)
		if err != nil {
			return err
		}
	}
	return nil
}

// deletePrefilled removes every prefilled record.
func (p *postgresBench) deletePrefilled(ctx context.Context) error {
	_, err := p.admin.Exec(ctx, "DELETE FROM "+p.ident()+" WHERE scope = ''::bytea AND key >= $1 AND key < $2",
		[]byte("prefill-"), []byte("prefill."))
	p.prefilled = 0
	return err
}

func (p *postgresBench) fill(ctx context.Context, n int) ([]benchreport.SizeItem, error) {
	if n < p.prefilled {
		if err := p.deletePrefilled(ctx); err != nil {
			return nil, err
		}
	}
	if n > p.prefilled {
		if err := p.copyRecords(ctx, p.prefilled+1, n, nil); err != nil {
			return nil, err
		}
		p.prefilled = n
	}
	// Compact, so that the sizes are what the records take, not what
	// earlier levels' deleted rows left, and every level starts alike.
	if _, err := p.admin.Exec(ctx, "VACUUM (FULL, ANALYZE) "+p.ident()); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	var table, indexes, rows int64
	err := p.admin.QueryRow(ctx, "SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass), (SELECT count(*) FROM "+p.ident()+")",
		p.table).Scan(&table, &indexes, &rows)
	if err != nil {
		return nil, err
	}
	return []benchreport.SizeItem{
		{What: "table", BytesPerRecord: float64(table) / float64(rows)},
		{What: "indexes", BytesPerRecord: float64(indexes) / float64(rows)},
	}, nil
}

func (p *postgresBench) beforePhase(context.Context) error { return nil }

func (p *postgresBench) afterPhase(ctx context.Context, kind, prefix string, keys int64) error {
	if kind != benchreport.KindFirst || keys == 0 {
		return nil
	}
	if _, err := p.admin.Exec(ctx, "DELETE FROM "+p.ident()+" WHERE scope = ''::bytea AND key >= $1 AND key < $2",
		[]byte(prefix+"-"), []byte(prefix+".")); err != nil {
		return fmt.Errorf("loadbench: postgres: removing a phase's records: %w", err)
	}
	// Vacuum now, so that autovacuum does not start during a later phase.
	if _, err := p.admin.Exec(ctx, "VACUUM "+p.ident()); err != nil {
		return fmt.Errorf("loadbench: postgres: %w", err)
	}
	return nil
}

func (p *postgresBench) handler() http.Handler { return p.h }

func (p *postgresBench) meters() meters {
	m := meters{
		cpu:   p.backends.total,
		wire:  p.wire,
		calls: func(context.Context) (int64, bool) { return 0, false },
	}
	if p.statements {
		m.calls = func(ctx context.Context) (int64, bool) {
			var n int64
			err := p.admin.QueryRow(ctx, "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%' || $1 || '%'",
				p.table).Scan(&n)
			return n, err == nil
		}
	}
	return m
}

func (p *postgresBench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if p.store != nil {
		p.store.Close()
	}
	if p.admin != nil {
		p.admin.Exec(ctx, "DROP TABLE IF EXISTS "+p.ident())
		p.admin.Close(ctx)
	}
	if p.pool != nil {
		p.pool.Close()
	}
}
