// Command idemctl looks up and settles the idempotency records that the
// middleware of package server keeps in PostgreSQL (pgstore) or Redis
// (redisstore): the answer to "did this request happen?" when the middleware
// could not tell, because a holder was lost after its effect may have
// happened, or a retry was answered "outcome unknown".
//
// Usage:
//
//	idemctl lookup  [flags] KEY
//	idemctl resolve [flags] -status CODE [-body TEXT | -body-file FILE] [-header 'Name: value']... KEY
//	idemctl forget  [flags] KEY
//
// lookup prints the record of KEY: its state (in flight, completed, or
// outcome unknown: completed with the middleware's final answer, which its
// Idempotent-Outcome: unknown header marks whatever error writer wrote its
// body), how many holders ran it and how many of them were abandoned, when
// it was first claimed, when the lease ends and when the record expires,
// and the stored response. resolve records the request as done with the
// response given (a final status, 200 to 599, and headers other than
// Idempotent-Outcome), replayed to every retry for -ttl; forget deletes the
// record, so that the next request with KEY runs. idemctl -h lists the
// flags of every command. Either
// way a holder still running loses its lease and can no longer complete;
// both refuse a key in flight whose holder's lease is live (it may still be
// running, and do its effect after it) unless -force is given. The lease's
// end is the store's clock and is compared with this machine's.
//
// The store is given by -store, or by the IDEMCTL_STORE environment variable
// (which keeps a password out of the process list and the shell's history):
// a postgres:// or postgresql:// URL, with -table for a table other than
// pgstore's default; or a redis://, rediss:// or unix:// URL, with -prefix
// for a key prefix other than redisstore's default, and -cluster for a
// Redis Cluster. Neither the URL nor its password is ever printed.
//
// KEY is the key as the client sent it, bare or in its quoted header form.
// Records are kept per scope: -scope is the scope the middleware's scope
// function returned for the caller, as logged in its events (the "scope"
// attribute of its log lines, Event.Scope), empty for an API with one
// caller.
//
// The exit status is 0 on success, 1 when the store failed or cannot look
// records up, 2 for a usage error, 3 when KEY has no record (it was never
// claimed, was released, or expired), and 4 when resolve or forget refused a
// key whose holder's lease is live.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/redis/go-redis/v9"
)

func main() {
	// The command reports each failure once, itself; the Redis client's own
	// log would repeat every failed dial on standard error.
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], environment{
		stdout: os.Stdout,
		stderr: os.Stderr,
		getenv: os.Getenv,
		open:   openStore,
		now:    time.Now,
	})
	stop()
	os.Exit(code)
}

// quiet is a Redis client logger that logs nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
	exitLive     = 4
)

// environment is what run takes from the process, so that a test can give
// its own: a memstore instead of a database, a fixed clock.
type environment struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	open           opener
	now            func() time.Time
}

// opener connects to the store that a storeConfig names. close releases
// what it opened.
type opener func(ctx context.Context, c storeConfig) (store engine.Store, close func(), err error)

// errUsage marks an error in the command line.
var errUsage = errors.New("usage")

// run is the whole command but for the process: it returns the exit status.
func run(ctx context.Context, args []string, env environment) int {
	cmd, err := parseArgs(args, env)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "idemctl: %v\nRun 'idemctl -h' for usage.\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, cmd.timeout)
	defer cancel()
	store, closeStore, err := env.open(ctx, cmd.store)
	if err != nil {
		fmt.Fprintf(env.stderr, "idemctl: %s\n", cmd.store.redact(err))
		return exitFailed
	}
	defer closeStore()
	in, ok := store.(engine.Inspector)
	if !ok {
		fmt.Fprintf(env.stderr, "idemctl: the %s store (%T) cannot look records up: it does not implement engine.Inspector; upgrade the module\n", cmd.store.kind, store)
		return exitFailed
	}
	err = cmd.do(ctx, in, env)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errLive):
		fmt.Fprintf(env.stderr, "idemctl: %v\n", err)
		return exitLive
	case errors.Is(err, engine.ErrNotFound):
		fmt.Fprintf(env.stderr, "idemctl: no record for key %q in scope %q: it was never claimed, was released, or expired\n", cmd.id.Key, cmd.id.Scope)
		return exitNotFound
	}
	fmt.Fprintf(env.stderr, "idemctl: %s\n", cmd.store.redact(err))
	return exitFailed
}
