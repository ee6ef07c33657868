package storetest_test

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/store/redisstore"
	"github.com/idemkit/idempotency/store/storetest"
)

// Run belongs in a test of the Store's package, run with go test -race. An
// example cannot be given a *testing.T, so this one is compiled but not run;
// TestMemstore in this package's tests runs the same code.
//
// Each subtest gets a fresh Store here, closed when the subtest ends.
func ExampleRun() {
	// In memstore_test.go:
	TestConformance := func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) engine.Store {
			s, err := memstore.New()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		})
	}
	_ = TestConformance
}

// A Store on a shared server can be made once and given to every subtest:
// Run gives each subtest keys of its own, so nothing needs cleaning between
// them. Here a Redis store, in a test that skips, saying how to run it, when
// no server is configured.
func ExampleRun_sharedStore() {
	// In redisstore_test.go:
	TestConformance := func(t *testing.T) {
		url := os.Getenv("REDIS_URL")
		if url == "" {
			t.Skip("set REDIS_URL to run the conformance suite against Redis")
		}
		opts, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		client := redis.NewClient(opts)
		t.Cleanup(func() { client.Close() })
		store, err := redisstore.New(client)
		if err != nil {
			t.Fatal(err)
		}
		storetest.Run(t, func(*testing.T) engine.Store { return store })
	}
	_ = TestConformance
}
