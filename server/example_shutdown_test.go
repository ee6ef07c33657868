package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// A graceful shutdown stops the server first, then waits for the responses
// the middleware is still storing after they were sent (their Complete
// failed within the store timeout), then closes the store.
func ExampleMiddleware_Shutdown() {
	store, err := memstore.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	mw, err := server.New(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := &http.Server{Handler: mw.Handler(http.NotFoundHandler()), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	// ... on SIGTERM:
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fmt.Println("server:", srv.Shutdown(ctx))
	fmt.Println("serve:", <-served)
	fmt.Println("middleware:", mw.Shutdown(ctx))
	fmt.Println("store:", store.Close())
	// Output:
	// server: <nil>
	// serve: http: Server closed
	// middleware: <nil>
	// store: <nil>
}
