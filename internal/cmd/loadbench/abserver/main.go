// Command abserver is the server of internal/cmd/loadbench's A/B mode: the
// load runs' handler (it reads the request and answers 201 with 1 KiB)
// behind this module's middleware on one store, or, with -minimal, behind
// the fewest store statements that a first execution and a replay need.
//
//	abserver -store memory|postgres|redis [-minimal] [-addr 127.0.0.1:0] [-pool 32]
//	         [-table NAME] [-redis-url URL -prefix PREFIX]
//
// PostgreSQL is IDEMPOTENCY_POSTGRES_URL's (by default 127.0.0.1:5432,
// database test): a URL, which may hold a password, is not a command line
// argument, which every user of the machine can read.
//
// Once it serves, it prints one line of JSON on its standard output,
// {"protocol":2,"url":"http://127.0.0.1:PORT"}, and it answers the run's
// requests under /loadbench/ (control.go); every other request is load. It
// serves until it is killed.
//
// loadbench builds this program from each revision that it compares, the
// revision's own copy, so that every revision is served by the code written
// for it. All that it uses of this module is in idem.go, and only what every
// revision has had since the stores were first measured: server.New,
// memstore.New, pgstore.New with WithTable and Migrate, redisstore.New with
// WithPrefix; for a revision older than this program, loadbench builds this
// tree's copy on the revision's packages. idem_peer.go, which the build of
// this module ignores, is what loadbench puts in place of idem.go to serve
// another library's middleware (-peer-dir).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// protocol is the version of how loadbench and this program work together:
// the flags and the environment that start it, what it prints, and the
// requests under /loadbench/. A change to any of them is a new version;
// loadbench refuses a server of a version other than its own, which is a
// revision's server of another time.
const protocol = 2

// config is the command line.
type config struct {
	store       string
	minimal     bool
	addr        string
	pool        int
	postgresURL string
	table       string
	redisURL    string
	prefix      string
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("abserver: ")
	var cfg config
	flag.StringVar(&cfg.store, "store", "memory", "the store: memory, postgres or redis")
	flag.BoolVar(&cfg.minimal, "minimal", false, "serve the minimal store statements instead of the middleware")
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:0", "address to listen on")
	flag.IntVar(&cfg.pool, "pool", 32, "most connections of the store's client")
	flag.StringVar(&cfg.table, "table", "idempotency_abserver", "PostgreSQL table, created if missing")
	flag.StringVar(&cfg.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis")
	flag.StringVar(&cfg.prefix, "prefix", "abserver:", "prefix of the Redis keys")
	flag.Parse()
	if cfg.postgresURL = os.Getenv("IDEMPOTENCY_POSTGRES_URL"); cfg.postgresURL == "" {
		cfg.postgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	if cfg.pool < 1 {
		log.Fatal("-pool must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	s, err := newServer(ctx, cfg)
	cancel()
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: s, ErrorLog: log.New(io.Discard, "", 0)}
	if err := json.NewEncoder(os.Stdout).Encode(ready{Protocol: protocol, URL: "http://" + ln.Addr().String()}); err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(ln))
}

// ready is the line printed once the program serves.
type ready struct {
	Protocol int    `json:"protocol"`
	URL      string `json:"url"`
}

// newServer sets up the store and what serves it.
func newServer(ctx context.Context, cfg config) (*router, error) {
	s := &router{wire: &wire{}, pool: cfg.pool}
	var (
		t   target
		err error
	)
	switch cfg.store {
	case "memory":
		fresh := newMemory
		if cfg.minimal {
			fresh = newMinimalMemory
		}
		t.fresh = fresh
		t.h, t.close, err = fresh()
	case "postgres":
		var pc *pgxpool.Config
		if pc, err = s.postgresConfig(cfg); err != nil {
			return nil, err
		}
		if cfg.minimal {
			t.h, t.conns, err = newMinimalPostgres(ctx, pc, cfg.table)
		} else {
			t.h, t.conns, err = newPostgres(ctx, pc, cfg.table)
		}
	case "redis":
		var opt *redis.Options
		if opt, err = redis.ParseURL(cfg.redisURL); err != nil {
			return nil, errors.New("the Redis URL is not valid")
		}
		opt.PoolSize = cfg.pool
		opt.Dialer = s.wire.dial
		client := redis.NewClient(opt)
		if err = warmRedis(ctx, client, cfg.pool); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		if cfg.minimal {
			t.h, err = newMinimalRedis(client, cfg.prefix)
		} else {
			t.h, err = newRedis(ctx, client, cfg.prefix)
		}
	default:
		return nil, fmt.Errorf("unknown store %q (memory, postgres or redis)", cfg.store)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.store, err)
	}
	if k, ok := t.h.(kinded); ok {
		t.kind = k
	}
	s.t = t
	s.h.Store(&t.h)
	return s, nil
}

// postgresConfig returns the configuration of a pool of cfg.pool
// connections whose sockets are counted. loadbench finds their backends by
// the application_name that it puts in the URL.
func (s *router) postgresConfig(cfg config) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(cfg.postgresURL)
	if err != nil {
		// The URL may hold a password: do not print it.
		return nil, errors.New("the PostgreSQL URL is not valid")
	}
	pc.MaxConns = int32(cfg.pool)
	pc.ConnConfig.DialFunc = s.wire.dial
	return pc, nil
}

// warmRedis opens n of the client's connections now.
func warmRedis(ctx context.Context, client *redis.Client, n int) error {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- client.Do(ctx, "PING").Err() }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// respBody is the handler's answer.
var respBody = func() []byte {
	b := make([]byte, 1024)
	for i := range b {
		b[i] = 'r'
	}
	return b
}()

// handler is the application: it reads the request and answers 201 with
// 1 KiB, as loadbench's own.
func handler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(respBody)
}
