package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/pgstore"
)

// A Store on the application's pool, with its table created at start-up and
// expired records swept in the background.
func Example() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// pgxpool otherwise goes on connecting for two minutes after the caller
	// has given up.
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	store, err := pgstore.New(pool, pgstore.WithSweeper(time.Minute, 1000))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// The middleware of package server takes the store.
	var createOrder http.Handler // the application's
	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(createOrder))
	log.Fatal(http.ListenAndServe(":8080", mux))
}

// In transactional mode the handler writes its order in the transaction of
// its lease: the order and the stored response commit together, and a
// failure or a panic rolls both back.
func ExampleTxFromContext() {
	var pool *pgxpool.Pool // the application's
	store, err := pgstore.New(pool, pgstore.WithTransactions(), pgstore.WithLockTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := pgstore.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "not run under the idempotency middleware", http.StatusInternalServerError)
			return
		}
		var id int64
		err := tx.QueryRow(r.Context(), "INSERT INTO orders (amount) VALUES ($1) RETURNING id", 100).Scan(&id)
		if err != nil {
			// A 5xx: the middleware releases the claim, which rolls back
			// the transaction.
			http.Error(w, "could not place the order", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})

	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe(":8080", mw.Handler(createOrder)))
}

// A handler places its order in a step: the order's row and the step's
// record commit together, so that a retry after a crash, or after a 5xx,
// finds the order placed and places no second one.
func ExampleRunStep() {
	var store pgstore.Store // the application's
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		amount := 100 // from the request
		orderID, err := pgstore.RunStep(r.Context(), store, "order", amount,
			func(ctx context.Context, tx pgx.Tx) (int64, error) {
				var id int64
				err := tx.QueryRow(ctx, "INSERT INTO orders (amount) VALUES ($1) RETURNING id", amount).Scan(&id)
				return id, err
			})
		if err != nil {
			// A 5xx releases the key: the retry resumes after the
			// steps that were recorded.
			http.Error(w, "could not place the order", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orderID)
	})

	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe(":8080", mw.Handler(placeOrder)))
}

// A scheduled job sweeps expired records for every instance.
func ExampleStore_Sweep() {
	var store pgstore.Store // as in the package example
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deleted, err := store.Sweep(ctx, 10000)
	if err != nil {
		log.Print(err)
	}
	log.Printf("swept %d expired idempotency records", deleted)
}

// The schema for a team's own migrations.
func ExampleSchema() {
	sql, err := pgstore.Schema("billing.idempotency")
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.Lines(sql) {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Print(line)
		}
	}
	// Output:
	// CREATE SEQUENCE IF NOT EXISTS "billing"."idempotency_token_seq" AS bigint CACHE 1;
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency" (
	// CREATE INDEX IF NOT EXISTS "idempotency_sweep_at_idx" ON "billing"."idempotency" (sweep_at);
}

// An operator looks a key up, and records a request whose holder was lost
// after its effect as done, with the response that retries will replay.
func ExampleStore_Resolve() {
	var store pgstore.Store // the application's
	ctx := context.Background()
	id := engine.ID{Scope: "tenant-42", Key: "order-123"}
	rec, err := store.Lookup(ctx, id)
	if errors.Is(err, engine.ErrNotFound) {
		fmt.Println("no record: the next request with the key runs")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("completed %v, abandoned by %d holders, first claimed at %v\n", rec.Completed, rec.Abandoned, rec.Created)
	if rec.Completed {
		return
	}
	// The order was found in the business database: record it as done.
	done := &engine.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"order":123}`),
	}
	if err := store.Resolve(ctx, id, done, 24*time.Hour); err != nil {
		log.Fatal(err)
	}
}
