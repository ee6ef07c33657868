package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/memstore"
)

// printDoor is the smallest door: its work prints a line and its result is
// that line; it answers by printing what the engine decided.
type printDoor struct {
	call engine.Call
	work string
}

func (d *printDoor) Replay(resp *engine.Response) int {
	fmt.Printf("replayed: %s\n", resp.Body)
	return resp.Status
}

func (d *printDoor) Refuse(kind error, retryAfter time.Duration, cause error) int {
	fmt.Println("refused:", kind)
	return 409
}

func (d *printDoor) Execute(ctx context.Context) engine.Outcome {
	lease, _ := engine.LeaseFromContext(ctx)
	fmt.Printf("ran %s under token %d\n", d.work, lease.Token)
	return engine.Outcome{Status: 200, Response: &engine.Response{Status: 200, Body: []byte(d.work + " done")}}
}

func (d *printDoor) Send(now bool) { fmt.Println("answered") }

func (d *printDoor) OutcomeUnknown() *engine.Response {
	return &engine.Response{Status: 409, Header: map[string][]string{engine.HeaderOutcome: {"unknown"}}}
}

func (d *printDoor) Unprotected() {}

// A door of one's own over the engine: the first call with a key runs the
// work and stores its result; the second gets the result replayed; one with
// the same key and another fingerprint is refused.
func ExampleEngine_Do() {
	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	e, err := engine.New(store, engine.Config{TTL: time.Hour})
	if err != nil {
		panic(err)
	}
	defer e.Shutdown(context.Background())

	id := engine.ID{Scope: "jobs", Key: "nightly-2026-12-02"}
	for _, fp := range []string{"report", "report", "another report"} {
		d := &printDoor{work: "report"}
		e.Do(context.Background(), &d.call, id, fp, d)
	}
	// Output:
	// ran report under token 1
	// answered
	// replayed: report done
	// refused: idempotency key reused for a different request
}
