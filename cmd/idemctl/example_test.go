package main

import (
	"context"
	"net/http"
	"os"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// recorded is a store that holds one record, as an operator finds it.
type recorded struct {
	engine.Store
	r engine.Record
}

func (s *recorded) Lookup(_ context.Context, id engine.ID) (engine.Record, error) {
	if id != s.r.ID {
		return engine.Record{}, engine.ErrNotFound
	}
	return s.r, nil
}

func (s *recorded) Resolve(_ context.Context, id engine.ID, resp *engine.Response, ttl time.Duration) error {
	if id != s.r.ID {
		return engine.ErrNotFound
	}
	s.r.Response, s.r.Completed = resp, true
	return nil
}

// A retry whose first holder was lost was answered "outcome unknown"; the
// operator finds the order was made, and records it as done.
func Example_lookupAndResolve() {
	created := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	store := &recorded{r: engine.Record{
		ID:          engine.ID{Scope: "auth:5d41402abc4b2a76", Key: "order-7"},
		Completed:   true,
		Fingerprint: "\x9f\x86\xd0\x81",
		Token:       42,
		Abandoned:   1,
		Created:     created,
		Expires:     created.Add(24 * time.Hour),
		Response: &engine.Response{
			Status: http.StatusConflict,
			Header: http.Header{"Content-Type": {"application/problem+json"}, "Idempotent-Outcome": {"unknown"}},
			Body:   []byte(`{"type":"https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrOutcomeUnknown","status":409}`),
		},
	}}
	env := environment{
		stdout: os.Stdout,
		stderr: os.Stdout,
		getenv: func(string) string { return "postgres://operator:secret@db.internal/orders" },
		open: func(context.Context, storeConfig) (engine.Store, func(), error) {
			return store, func() {}, nil
		},
		now: func() time.Time { return created.Add(10 * time.Minute) },
	}
	ctx := context.Background()
	run(ctx, []string{"lookup", "-scope", "auth:5d41402abc4b2a76", "order-7"}, env)
	run(ctx, []string{"resolve", "-scope", "auth:5d41402abc4b2a76", "-status", "201", "-body", `{"order":7}`, "order-7"}, env)
	// Output:
	// scope        auth:5d41402abc4b2a76
	// key          order-7
	// state        outcome unknown: retries get a final 409 until it is resolved or expires
	// attempts     2 (1 abandoned: lost their lease without completing)
	// started      2026-12-01T09:30:00Z (10m0s ago)
	// expires      2026-12-02T09:30:00Z (in 23h50m0s)
	// token        42
	// fingerprint  9f86d081
	// response     409 Conflict, 98 body bytes
	//              Content-Type: application/problem+json
	//              Idempotent-Outcome: unknown
	// body         {"type":"https://pkg.go.dev/github.com/idemkit/idempotency/server#ErrOutcomeUnknown","status":409}
	// resolved: key "order-7" in scope "auth:5d41402abc4b2a76", outcome unknown before, is recorded as done with 201 Created (11 body bytes); every retry gets it for 24h0m0s
}
