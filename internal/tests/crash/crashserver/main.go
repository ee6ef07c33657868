// Command crashserver is the orders API that the crash tests kill with
// SIGKILL in the middle of its work and start again on the same store.
//
// POST /orders, behind the idempotency middleware, takes {"ref": "...",
// "lines": n} and writes an order and its n lines to PostgreSQL, pausing
// -step before each line, so that a handler is caught half-way as often as
// not. The order is then done, and the handler pauses -after before it
// answers: the work a real API does between its last write and its response,
// and the window in which a crash leaves an effect without a stored response.
//
// With -store pg-tx the records live in PostgreSQL in pgstore's transactional
// mode, and the order is written in the record's transaction
// (pgstore.TxFromContext); with -store pg-lease or redis-lease the records
// live in PostgreSQL or Redis in lease mode, and the order is written in a
// transaction of the handler's own, committed before the pause -after; with
// mem-lease the records live in the process's memory (memstore), and die
// with it; with sqlite-lease they live in the SQLite file -records
// (sqlitestore), which the restarted process opens again; with mysql-lease
// in the MySQL (MariaDB) table -records (mysqlstore). In every lease mode the
// order row records the Lease.Abandoned of the run that wrote it.
//
// With -abandoned refuse, a retry that takes over an order whose holder was
// killed is not run again: it gets the final "outcome unknown" answer
// (engine.RefuseAbandoned).
//
// -ttl is the middleware's TTL (engine.Config.TTL) and -lease its lease
// (engine.Config.Lease); with -lease 0 the lease is the middleware's default:
// a minute, or the TTL when that is shorter.
//
// With -takeover find, a run that took an order over from a killed holder
// (Lease.Abandoned > 0) looks for the order that holder may have written
// and answers with it if it is there, as Example_takeover does;
// with fail-once, the first such run of each order in the process answers
// 503 without looking (it cannot tell yet: the key is released), and the
// runs after it look. With rerun (the default) a takeover writes the order
// as a first run does. (Not with -downstream, whose orders are elsewhere.)
//
// With -downstream URL the order's effect is not written here: the handler
// sends the order, through an idempotency.Client, to a second service behind
// the middleware (URL, run by the test), which writes it, and answers with
// that service's answer after the pause -after. With -downstream-keys
// derived (the default) the request is made with the handler's own request
// context, so the client derives the downstream key from the incoming key
// and every run of the handler for one order sends the same key; with
// random, each run sends a new key (idempotency.NewKey), as a client that
// is not given the handler's context does.
//
// With -steps the handler is one of three steps (package step), described
// in steps.go: a charge sent through the client to the payment service at
// -downstream, an email written to a sink that counts, and the order, in a
// transactional step (pgstore.RunStep) when the records are in PostgreSQL;
// before each step's effect the handler writes down whether the store then
// held the step as done. With -direct too, the same three effects are done
// without steps, for contrast.
//
// GET /inflight answers the number of orders in flight: past the server's
// accepting them, not yet answered. The program prints
// "listening on ADDR" once it serves, and runs until it is killed.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/mysqlstore"
	"github.com/idemkit/idempotency/store/pgstore"
	"github.com/idemkit/idempotency/store/redisstore"
	"github.com/idemkit/idempotency/store/sqlitestore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	kind := flag.String("store", "pg-tx", "records in: pg-tx, pg-lease, redis-lease, sqlite-lease, mysql-lease or mem-lease (the process's memory)")
	records := flag.String("records", "", "table (PostgreSQL, MySQL), key prefix (Redis) or file (SQLite) of the records")
	orders := flag.String("orders", "", "table of the orders; its lines are in the table named with the suffix _lines")
	lease := flag.Duration("lease", time.Second, "the middleware's lease; 0: its default (a minute, or the TTL when shorter)")
	ttl := flag.Duration("ttl", time.Hour, "the middleware's TTL")
	takeover := flag.String("takeover", "rerun", "what a run that took an order over from a killed holder does: rerun, find (its order, first) or fail-once (answer 503 once, then find)")
	step := flag.Duration("step", 5*time.Millisecond, "pause before each line")
	after := flag.Duration("after", 10*time.Millisecond, "pause between the last write and the answer")
	abandoned := flag.String("abandoned", "rerun", "what a retry after an abandoned lease gets: rerun or refuse (engine.Config.Abandoned)")
	downURL := flag.String("downstream", "", "URL of the service that writes the orders; empty: write them here")
	keys := flag.String("downstream-keys", "derived", "keys of the downstream calls: derived (from the incoming key) or random")
	steps := flag.Bool("steps", false, "the handler of three steps (a charge through the client at -downstream, an email, the order); see steps.go")
	direct := flag.Bool("direct", false, "with -steps: the same three effects, none of them in a step")
	flag.Parse()
	if *records == "" || *orders == "" {
		log.Fatal("crashserver: -records and -orders are required")
	}
	policy := engine.RerunAbandoned
	switch *abandoned {
	case "rerun":
	case "refuse":
		policy = engine.RefuseAbandoned
	default:
		log.Fatalf("crashserver: -abandoned %q: want rerun or refuse", *abandoned)
	}
	switch *takeover {
	case "rerun", "find", "fail-once":
	default:
		log.Fatalf("crashserver: -takeover %q: want rerun, find or fail-once", *takeover)
	}
	if *keys != "derived" && *keys != "random" {
		log.Fatalf("crashserver: -downstream-keys %q: want derived or random", *keys)
	}
	if *steps && *downURL == "" {
		log.Fatal("crashserver: -steps needs -downstream, the payment service")
	}
	if *direct && !*steps {
		log.Fatal("crashserver: -direct goes with -steps")
	}
	var down *downstream
	if *downURL != "" {
		c, err := idempotency.NewClient(
			idempotency.WithAttemptTimeout(10*time.Second),
			idempotency.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
			idempotency.WithMaxAttempts(20),
			idempotency.WithMaxRetryAfter(2*time.Second),
			idempotency.WithBudget(nil),
		)
		if err != nil {
			log.Fatal(err)
		}
		down = &downstream{client: c, url: *downURL, random: *keys == "random"}
	}
	// A lease of 0 is the default one.
	cfg := engine.Config{TTL: *ttl, Lease: *lease, Abandoned: policy}
	var sa *stepsAPI
	if *steps {
		sa = &stepsAPI{direct: *direct}
	}
	if err := run(*addr, *kind, *records, *orders, *takeover, *step, *after, cfg, down, sa); err != nil {
		log.Fatal(err)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(addr, kind, records, orders, takeover string, step, after time.Duration, engineCfg engine.Config, down *downstream, steps *stepsAPI) error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(env("IDEMPOTENCY_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if err != nil {
		return errors.New("crashserver: IDEMPOTENCY_POSTGRES_URL is not a PostgreSQL URL")
	}
	cfg.MaxConns = 48
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	var (
		store         engine.Store
		pg            pgstore.Store // the records' store, on PostgreSQL
		transactional = false
	)
	switch kind {
	case "pg-tx", "pg-lease":
		opts := []pgstore.Option{pgstore.WithTable(records)}
		if kind == "pg-tx" {
			opts = append(opts, pgstore.WithTransactions())
			transactional = true
		}
		s, err := pgstore.New(pool, opts...)
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		store, pg = s, s
	case "mem-lease":
		s, err := memstore.New()
		if err != nil {
			return err
		}
		defer s.Close()
		store = s
	case "sqlite-lease":
		s, err := sqlitestore.Open(ctx, records)
		if err != nil {
			return err
		}
		defer s.Close()
		store = s
	case "mysql-lease":
		db, err := sql.Open("mysql", env("IDEMPOTENCY_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"))
		if err != nil {
			return errors.New("crashserver: IDEMPOTENCY_MYSQL_DSN is not a MySQL DSN")
		}
		db.SetMaxOpenConns(48)
		db.SetMaxIdleConns(48)
		defer db.Close()
		s, err := mysqlstore.New(db, mysqlstore.WithTable(records))
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		store = s
	case "redis-lease":
		opt, err := redis.ParseURL(env("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:6379/0"))
		if err != nil {
			return errors.New("crashserver: IDEMPOTENCY_REDIS_URL is not a Redis URL")
		}
		opt.ContextTimeoutEnabled = true
		opt.PoolSize = 48
		c := redis.NewClient(opt)
		defer c.Close()
		s, err := redisstore.New(c, redisstore.WithPrefix(records))
		if err != nil {
			return err
		}
		store = s
	default:
		return fmt.Errorf("crashserver: unknown store %q", kind)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	engineCfg.Logger = logger
	mw, err := server.New(store, server.WithConfig(engineCfg))
	if err != nil {
		return err
	}
	api := &api{pool: pool, transactional: transactional, step: step, after: after, downstream: down, takeover: takeover,
		insertOrder: "INSERT INTO " + pgx.Identifier{orders}.Sanitize() + " (ref, lines, abandoned) VALUES ($1, $2, $3) RETURNING id",
		insertLine:  "INSERT INTO " + pgx.Identifier{orders + "_lines"}.Sanitize() + " (order_id, n) VALUES ($1, $2)",
		findOrder:   "SELECT id FROM " + pgx.Identifier{orders}.Sanitize() + " WHERE ref = $1 ORDER BY id LIMIT 1",
	}
	if steps != nil {
		if err := steps.init(store, pg, orders, transactional); err != nil {
			return err
		}
		api.steps = steps
	}
	mux := http.NewServeMux()
	// A request counts from before its claim until its response is
	// stored and sent: a crash anywhere in that span may leave it to be
	// run again.
	protected := mw.Handler(api)
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		api.inflight.Add(1)
		defer api.inflight.Add(-1)
		protected.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /inflight", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, api.inflight.Load())
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening on " + ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

type api struct {
	pool                               *pgxpool.Pool
	transactional                      bool
	step, after                        time.Duration
	insertOrder, insertLine, findOrder string
	downstream                         *downstream
	inflight                           atomic.Int64
	takeover                           string    // -takeover
	failed                             sync.Map  // refs whose takeover answered 503 (fail-once)
	steps                              *stepsAPI // -steps
}

// downstream is the service that writes the orders, when it is not this one.
type downstream struct {
	client *idempotency.Client
	url    string
	random bool
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Ref   string
		Lines int
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Ref == "" || in.Lines < 0 || in.Lines > 100 {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	if a.steps != nil {
		a.serveSteps(ctx, w, in.Ref, in.Lines)
		return
	}
	if lease, _ := engine.LeaseFromContext(ctx); lease.Abandoned > 0 && a.takeover != "rerun" && a.downstream == nil {
		if _, failed := a.failed.LoadOrStore(in.Ref, true); !failed && a.takeover == "fail-once" {
			http.Error(w, "cannot tell yet whether the order was written", http.StatusServiceUnavailable)
			return
		}
		// A killed holder may have written the order before it died.
		var id int64
		switch err := a.pool.QueryRow(ctx, a.findOrder, in.Ref).Scan(&id); {
		case err == nil:
			a.answer(w, id, in.Ref)
			return
		case !errors.Is(err, pgx.ErrNoRows):
			a.fail(w, in.Ref, "find", err)
			return
		}
	}
	if a.downstream != nil {
		a.forward(ctx, w, in.Ref, in.Lines)
		return
	}
	var tx pgx.Tx
	if a.transactional {
		var ok bool
		if tx, ok = pgstore.TxFromContext(ctx); !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
	} else {
		var err error
		if tx, err = a.pool.Begin(ctx); err != nil {
			a.fail(w, in.Ref, "begin", err)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
	}
	var id int64
	lease, _ := engine.LeaseFromContext(ctx)
	if err := tx.QueryRow(ctx, a.insertOrder, in.Ref, in.Lines, lease.Abandoned).Scan(&id); err != nil {
		a.fail(w, in.Ref, "insert", err)
		return
	}
	for n := range in.Lines {
		if !pause(ctx, a.step) {
			a.fail(w, in.Ref, "pause", context.Cause(ctx))
			return
		}
		if _, err := tx.Exec(ctx, a.insertLine, id, n); err != nil {
			a.fail(w, in.Ref, "line", err)
			return
		}
	}
	if !a.transactional {
		// A commit cut short by the context (the lease lost, the
		// client gone) may have been applied all the same: answered
		// 503, its key released, the order would run again.
		if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
			a.fail(w, in.Ref, "commit", err)
			return
		}
	}
	// The order is written (committed, in lease mode); what remains is
	// the work between the last write and the answer.
	pause(context.WithoutCancel(ctx), a.after)
	a.answer(w, id, in.Ref)
}

// answer answers with order id.
func (a *api) answer(w http.ResponseWriter, id int64, ref string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%s,"ref":%q}`, strconv.FormatInt(id, 10), ref)
}

// forward has the downstream service write the order, and answers with its
// answer once it is written, after the pause a.after.
func (a *api) forward(ctx context.Context, w http.ResponseWriter, ref string, lines int) {
	if a.downstream.random {
		// A key of its own for each run, where the derived one is the
		// same in every run.
		ctx = idempotency.ContextWithKey(ctx, idempotency.NewKey())
	}
	body, err := json.Marshal(map[string]any{"ref": ref, "lines": lines})
	if err != nil {
		a.fail(w, ref, "downstream", err)
		return
	}
	resp, err := a.downstream.client.Post(ctx, a.downstream.url, "application/json", bytes.NewReader(body))
	if err != nil {
		a.fail(w, ref, "downstream", err)
		return
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		a.fail(w, ref, "downstream", err)
		return
	}
	if resp.StatusCode != http.StatusCreated {
		a.fail(w, ref, "downstream", fmt.Errorf("downstream answered %d: %s", resp.StatusCode, out))
		return
	}
	pause(context.WithoutCancel(ctx), a.after)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(out)
}

// fail answers 503 for an order that could not be written, and says at
// which step and why on standard error.
func (a *api) fail(w http.ResponseWriter, ref, step string, err error) {
	log.Printf("crashserver: order %s not written (%s): %v", ref, step, err)
	http.Error(w, "order not written", http.StatusServiceUnavailable)
}

// pause waits d, or until ctx is done; it reports whether it waited d.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
