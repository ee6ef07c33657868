package exampleapp

import (
	"context"
	"encoding/json"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
)

// Run is the body of an example program: it makes the API with newHandler,
// given an in-memory store (package memstore), an empty Book and the demo
// Accounts, and serves it on addr until the process receives SIGINT (Ctrl-C)
// or SIGTERM. Then it shuts the server down, waiting up to 10 seconds for the
// requests in flight, and returns nil. It returns early the error of
// newHandler, of listening on addr, or of serving.
func Run(addr string, newHandler func(store server.Store, book *Book, accounts map[string]string) (http.Handler, error)) error {
	store := memstore.New()
	defer store.Close()
	h, err := newHandler(store, &Book{}, Accounts())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Printf("orders API on http://%s (Ctrl-C stops it)", ln.Addr())
	return serve(ctx, ln, h)
}

// serve serves h on ln until ctx is done, then shuts the server down.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	<-errc // http.ErrServerClosed, at once
	return err
}

// WriteJSON answers with the status and v in JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
