// Command ordersdemo is the module's demo: a client submits orders to an API
// through a network that loses responses, first retrying naively, then with
// this module's client and middleware, and shows what each did.
//
//	go run ./cmd/ordersdemo                       # in-memory store
//	go run ./cmd/ordersdemo -store postgres       # or redis; see -h
//
// It starts the API (package server's middleware around an order handler),
// a lossy proxy in front of it that drops a share of the responses after the
// API handled the request, resets some connections before it sees them, and
// delays some past the client's per-attempt timeout, and then submits -n
// orders from -c concurrent workers, each until it succeeds:
//
//   - naive: an http.Client that retries every failure without a key. Each
//     lost response becomes a duplicate order.
//   - idempotency: idempotency.Client, which sends one key per order on
//     every attempt; the middleware runs each key once and replays it.
//
// The API accepts requests without a key (server.WithKeyOptional), so that
// the naive run reaches it; a real API would require keys.
//
// After the table of each run's results it prints what the middleware told
// its observer (engine.Config.Observer) it did in each run: first executions,
// replays, 409s for requests in flight, 503s, ...
//
// It is a command of the repository rather than an example, because its
// lossy network is the test suite's proxy (internal/testkit/faultnet); the
// programs under examples/ import only public packages and can be copied.
//
// It exits with status 1 if the idempotent run created a duplicate or
// failed an order.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	var o Options
	o.Flags(flag.CommandLine)
	flag.Parse()
	if _, err := Run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ordersdemo:", err)
		os.Exit(1)
	}
}
