package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// What the A/B mode does to the stores, it does from outside the servers,
// the same way for every variant, whatever each variant's layout: a
// PostgreSQL table is only known to have a bytea column key, and a Redis
// record to be one key.

// errNoRecord is returned when the replayed key's record is not found in
// a store after seeding.
var errNoRecord = errors.New("the replayed key's record is not where it was looked for")

// abPostgres is the PostgreSQL server of an A/B run, which every variant
// uses, each on a table of its own.
type abPostgres struct {
	admin *pgx.Conn
	url   string
	// prefix begins the name of every table, sequence and function that
	// the run's servers make.
	prefix     string
	syncCommit string
	version    string
	// local says whether the backends are processes of this machine.
	local bool
	// statements says whether pg_stat_statements can be read.
	statements bool
	tables     []*abPostgresTable
}

func newABPostgres(ctx context.Context, id, syncCommit string) (*abPostgres, error) {
	u := os.Getenv("IDEMPOTENCY_POSTGRES_URL")
	if u == "" {
		u = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		// The URL may hold a password: do not print it.
		return nil, errors.New("loadbench: IDEMPOTENCY_POSTGRES_URL is not a valid URL")
	}
	p := &abPostgres{url: u, prefix: "idempotency_loadbench_" + id, syncCommit: syncCommit}
	if p.admin, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("loadbench: postgres: %w", err)
	}
	if err := p.admin.QueryRow(ctx, "SHOW server_version").Scan(&p.version); err != nil {
		p.admin.Close(ctx)
		return nil, fmt.Errorf("loadbench: postgres: %w", err)
	}
	p.local = isProcess(int(p.admin.PgConn().PID()), "postgres")
	var n int64
	p.statements = p.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n) == nil
	return p, nil
}

// table returns the table of the variant tagged tag, and the URL its server
// connects with: it names the server's sessions, so that their backends can
// be found.
func (p *abPostgres) table(tag string) (*abPostgresTable, error) {
	t := &abPostgresTable{pg: p, name: p.prefix + "_" + tag, app: "loadbench_" + strings.TrimPrefix(p.prefix, "idempotency_loadbench_") + "_" + tag}
	params := map[string]string{"application_name": t.app}
	if p.syncCommit != "" {
		params["synchronous_commit"] = p.syncCommit
	}
	if strings.HasPrefix(p.url, "postgres://") || strings.HasPrefix(p.url, "postgresql://") {
		u, err := withQuery(p.url, params)
		if err != nil {
			return nil, errors.New("IDEMPOTENCY_POSTGRES_URL is not a valid URL")
		}
		t.url = u
	} else { // keyword=value
		t.url = p.url
		for k, v := range params {
			t.url += " " + k + "=" + v
		}
	}
	p.tables = append(p.tables, t)
	t.backends = newProcCPU()
	return t, nil
}

// close drops every table, sequence and function of the run.
func (p *abPostgres) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, t := range p.tables {
		p.admin.Exec(ctx, "DROP TABLE IF EXISTS "+t.ident()+" CASCADE")
	}
	like := strings.ReplaceAll(p.prefix, "_", `\_`) + "%"
	rows, err := p.admin.Query(ctx, `SELECT 'SEQUENCE ' || c.oid::regclass::text FROM pg_class c WHERE c.relkind = 'S' AND c.relname LIKE $1
		UNION ALL SELECT 'FUNCTION ' || p.oid::regprocedure::text FROM pg_proc p WHERE p.proname LIKE $1`, like)
	if err == nil {
		left, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err == nil {
			for _, what := range left {
				p.admin.Exec(ctx, "DROP "+what+" CASCADE")
			}
		}
	}
	p.admin.Close(ctx)
}

// abPostgresTable is a variant's table.
type abPostgresTable struct {
	pg   *abPostgres
	name string
	// app is the application_name of the server's sessions.
	app string
	url string
	// replay is the replayed key.
	replay []byte
	// backends are the CPU times of the backends of the current phase.
	backends *procCPU
}

func (t *abPostgresTable) ident() string { return pgx.Identifier{t.name}.Sanitize() }

// seeded checks that the table holds the replayed key's record.
func (t *abPostgresTable) seeded(ctx context.Context, key string) error {
	var n int64
	if err := t.pg.admin.QueryRow(ctx, "SELECT count(*) FROM "+t.ident()+" WHERE key = $1", []byte(key)).Scan(&n); err != nil {
		return fmt.Errorf("%w: %s: %w", errNoRecord, t.name, err)
	}
	if n != 1 {
		return fmt.Errorf("%w: %s holds %d rows with key %q", errNoRecord, t.name, n, key)
	}
	t.replay = []byte(key)
	return nil
}

// prefilled are the keys of copies: every key that begins with "prefill-".
const prefilledWhere = ` AND NOT (key >= 'prefill-'::bytea AND key < 'prefill.'::bytea)`

func (t *abPostgresTable) fill(ctx context.Context, n int) error {
	if _, err := t.pg.admin.Exec(ctx, "DELETE FROM "+t.ident()+" WHERE key <> $1", t.replay); err != nil {
		return err
	}
	if n > 0 {
		rows, err := t.pg.admin.Query(ctx, `SELECT column_name FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, t.name)
		if err != nil {
			return err
		}
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		var names, values []string
		for _, c := range cols {
			id := pgx.Identifier{c}.Sanitize()
			names = append(names, id)
			if c == "key" {
				id = `convert_to('prefill-' || g, 'UTF8')`
			}
			values = append(values, id)
		}
		const chunk = 100_000
		for lo := 1; lo <= n; lo += chunk {
			_, err := t.pg.admin.Exec(ctx, "INSERT INTO "+t.ident()+" ("+strings.Join(names, ", ")+") SELECT "+
				strings.Join(values, ", ")+" FROM "+t.ident()+", generate_series($2::int, $3::int) AS g WHERE key = $1",
				t.replay, lo, min(n, lo+chunk-1))
			if err != nil {
				return err
			}
		}
	}
	// Compact, and give the planner the table's statistics: the plans of
	// prepared statements are made with them.
	_, err := t.pg.admin.Exec(ctx, "VACUUM (FULL, ANALYZE) "+t.ident())
	return err
}

func (t *abPostgresTable) clean(ctx context.Context) error {
	if _, err := t.pg.admin.Exec(ctx, "DELETE FROM "+t.ident()+" WHERE key <> $1"+prefilledWhere, t.replay); err != nil {
		return err
	}
	// Vacuum now, so that autovacuum does not start during a later phase.
	_, err := t.pg.admin.Exec(ctx, "VACUUM "+t.ident())
	return err
}

// newPhase forgets the backends of the phase before: the server opens new
// connections for each of its phases.
func (t *abPostgresTable) newPhase() { t.backends = newProcCPU() }

// cpu returns the CPU time of the backends that the server's sessions have
// had in this phase.
func (t *abPostgresTable) cpu(ctx context.Context) (time.Duration, bool) {
	if !t.pg.local {
		return 0, false
	}
	rows, err := t.pg.admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", t.app)
	if err != nil {
		return 0, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, false
	}
	for _, pid := range pids {
		if isProcess(int(pid), "postgres") {
			t.backends.add(int(pid))
		}
	}
	return t.backends.total()
}

func (t *abPostgresTable) calls(ctx context.Context) (int64, bool) {
	if !t.pg.statements {
		return 0, false
	}
	var n int64
	err := t.pg.admin.QueryRow(ctx, "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE strpos(query, $1) > 0", t.name).Scan(&n)
	return n, err == nil
}

// close leaves the table to abPostgres.close.
func (t *abPostgresTable) close() {}

// abRedis is a variant's own redis-server: its CPU time and its command
// counts are that variant's alone, and variants' functions and keys never
// meet.
type abRedis struct {
	own     *redisProcess
	admin   *redis.Client
	procs   *procCPU
	version string
	// replay is the replayed record's key, and keep the keys that stay
	// from one phase to the next: it and its copies.
	replay string
	keep   map[string]bool
}

func newABRedis(ctx context.Context) (*abRedis, error) {
	own, err := startRedis()
	if err != nil {
		return nil, err
	}
	r := &abRedis{own: own, admin: redis.NewClient(&redis.Options{Addr: own.addr}), procs: newProcCPU()}
	r.procs.add(own.cmd.Process.Pid)
	info, err := r.admin.Info(ctx, "server").Result()
	if err != nil {
		r.close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	r.version = infoField(info, "redis_version")
	return r, nil
}

// keys returns every key of the server.
func (r *abRedis) keys(ctx context.Context) ([]string, error) {
	var all []string
	iter := r.admin.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		all = append(all, iter.Val())
	}
	return all, iter.Err()
}

// seeded finds the replayed key's record: the one key whose name holds the
// replayed key, or the only key.
func (r *abRedis) seeded(ctx context.Context, key string) error {
	all, err := r.keys(ctx)
	if err != nil {
		return err
	}
	var found []string
	for _, k := range all {
		if strings.Contains(k, key) {
			found = append(found, k)
		}
	}
	if len(found) == 0 && len(all) == 1 {
		found = all
	}
	if len(found) != 1 {
		return fmt.Errorf("%w: the server holds %d keys: %q", errNoRecord, len(all), all[:min(len(all), 5)])
	}
	r.replay = found[0]
	r.keep = map[string]bool{r.replay: true}
	return nil
}

// unlinkOthers removes every key but those kept.
func (r *abRedis) unlinkOthers(ctx context.Context) error {
	all, err := r.keys(ctx)
	if err != nil {
		return err
	}
	var batch []string
	for _, k := range all {
		if r.keep[k] {
			continue
		}
		if batch = append(batch, k); len(batch) == 1000 {
			if err := r.admin.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		return r.admin.Unlink(ctx, batch...).Err()
	}
	return nil
}

// fill stores n copies of the replayed record (DUMP, then RESTORE, whatever
// its type), named after it, with its time to live.
func (r *abRedis) fill(ctx context.Context, n int) error {
	r.keep = map[string]bool{r.replay: true}
	if err := r.unlinkOthers(ctx); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	dump, err := r.admin.Dump(ctx, r.replay).Result()
	if err != nil {
		return err
	}
	ttl, err := r.admin.PTTL(ctx, r.replay).Result()
	if err != nil {
		return err
	}
	if ttl < 0 {
		ttl = 0 // no expiry
	}
	const batch = 1000
	for lo := 1; lo <= n; lo += batch {
		pipe := r.admin.Pipeline()
		for i := lo; i <= min(n, lo+batch-1); i++ {
			k := r.replay + ":prefill-" + strconv.Itoa(i)
			r.keep[k] = true
			pipe.RestoreReplace(ctx, k, ttl, dump)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (r *abRedis) clean(ctx context.Context) error { return r.unlinkOthers(ctx) }

func (r *abRedis) cpu(context.Context) (time.Duration, bool) { return r.procs.total() }

// calls returns how many commands the server ran, those that functions and
// scripts call included, but for INFO, this program's own.
func (r *abRedis) calls(ctx context.Context) (int64, bool) {
	info, err := r.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, false
	}
	var n int64
	for line := range strings.Lines(info) {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		if c, err := strconv.ParseInt(calls, 10, 64); err == nil {
			n += c
		}
	}
	return n, true
}

func (r *abRedis) close() {
	r.admin.Close()
	r.own.stop()
}
