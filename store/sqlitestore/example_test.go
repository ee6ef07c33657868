package sqlitestore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/sqlitestore"
)

// A record kept in a file is still there after the process that wrote it
// is gone: the retry after a restart is a replay.
func Example() {
	dir, err := os.MkdirTemp("", "sqlitestore")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "idempotency.db")
	ctx := context.Background()
	id := engine.ID{Scope: "tenant-1", Key: "order-42"}

	store, err := sqlitestore.Open(ctx, path)
	if err != nil {
		log.Fatal(err)
	}
	c, err := store.Claim(ctx, id, "fingerprint", time.Minute, 24*time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Status)
	if err := store.Complete(ctx, id, c.Token, &engine.Response{Status: 201, Body: []byte(`{"id":42}`)}, 24*time.Hour); err != nil {
		log.Fatal(err)
	}
	store.Close()

	// The process restarts.
	store, err = sqlitestore.Open(ctx, path)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	c, err = store.Claim(ctx, id, "fingerprint", time.Minute, 24*time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Status, c.Response.Status, string(c.Response.Body))
	// Output:
	// acquired
	// completed 201 {"id":42}
}
