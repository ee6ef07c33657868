package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/wire"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/pgstore"
)

// The handler of -steps: three effects, each a step (package step) unless
// -direct, each recorded where the test counts it.
//
//   - "charge": the order is sent, through the idempotency.Client, to the
//     service at -downstream (a payment service behind the middleware, run
//     by the test), which writes a row for it. Inside the step the client
//     derives the downstream key from the step's name; with -direct, from
//     the incoming key (the handler's context).
//   - "email": a row in the table ORDERS_emails, which has no unique key,
//     as a mail sink that counts what it was sent; then the pause -step,
//     the mail server's answer.
//   - "order": the order and its lines, as the orders API without -steps
//     writes them. On PostgreSQL (pg-lease) in a transactional step
//     (pgstore.RunStep), whose writes commit with the step's record; on
//     the other stores in a step whose function commits a transaction of
//     its own.
//
// Before its effect, each step's function looks the call's record up in
// the store (engine.Inspector) and writes a row into ORDERS_runs: the step,
// and whether the store then held the step as done. A step whose record
// was stored must never run again; the rows tell such a run (recorded)
// from a step cut between its effect and its record (not recorded).
//
// A step that answers engine.ErrOutcomeUnknown (engine.RefuseAbandoned: its
// holder was lost while it ran) is answered with the final "outcome
// unknown" 409 problem, with the step's name in its "step" member.

// stepsAPI is what the -steps handler needs besides the orders API's.
type stepsAPI struct {
	direct                 bool // -direct: the effects without steps
	inspector              engine.Inspector
	insertEmail, insertRun string
	// order writes the order's row and lines in a step named "order"
	// (pgstore.RunStep on PostgreSQL).
	order func(ctx context.Context, a *api, ref string, lines int) (int64, error)
}

// init readies the handler for store, which is pg when the records are in
// PostgreSQL, and the tables of orders.
func (sa *stepsAPI) init(store engine.Store, pg pgstore.Store, orders string, transactional bool) error {
	if transactional {
		return errors.New("crashserver: -steps runs in lease mode: its transactional step is the order's")
	}
	if _, ok := store.(engine.StepStore); !ok && !sa.direct {
		return fmt.Errorf("crashserver: -steps needs a store that keeps steps (engine.StepStore), not %T", store)
	}
	insp, ok := store.(engine.Inspector)
	if !ok {
		return fmt.Errorf("crashserver: -steps looks records up: %T is not an engine.Inspector", store)
	}
	sa.inspector = insp
	sa.insertEmail = "INSERT INTO " + pgx.Identifier{orders + "_emails"}.Sanitize() + " (ref) VALUES ($1) RETURNING id"
	sa.insertRun = "INSERT INTO " + pgx.Identifier{orders + "_runs"}.Sanitize() + " (ref, step, recorded, abandoned) VALUES ($1, $2, $3, $4)"
	sa.order = plainOrder
	if pg != nil {
		sa.order = func(ctx context.Context, a *api, ref string, lines int) (int64, error) {
			return txOrder(ctx, a, pg, ref, lines)
		}
	}
	return nil
}

// placed is the answer to an order: what each step returned.
type placed struct {
	Ref    string `json:"ref"`
	Charge int64  `json:"charge"`
	Email  int64  `json:"email"`
	Order  int64  `json:"order"`
}

// stepInput is every step's input: the order.
type stepInput struct {
	Ref   string `json:"ref"`
	Lines int    `json:"lines"`
}

func (a *api) serveSteps(ctx context.Context, w http.ResponseWriter, ref string, lines int) {
	in := stepInput{Ref: ref, Lines: lines}
	var (
		out placed
		err error
	)
	out.Ref = ref
	if a.steps.direct {
		out.Charge, err = a.charge(ctx, in, false)
		if err != nil {
			a.stepFailed(w, ref, "charge", err)
			return
		}
		if out.Email, err = a.email(ctx, ref, false); err != nil {
			a.stepFailed(w, ref, "email", err)
			return
		}
		if out.Order, err = a.writeOrder(ctx, ref, lines); err != nil {
			a.stepFailed(w, ref, "order", err)
			return
		}
	} else {
		out.Charge, err = step.Run(ctx, "charge", in, func(ctx context.Context) (int64, error) {
			return a.charge(ctx, in, true)
		})
		if err != nil {
			a.stepFailed(w, ref, "charge", err)
			return
		}
		out.Email, err = step.Run(ctx, "email", in, func(ctx context.Context) (int64, error) {
			return a.email(ctx, ref, true)
		})
		if err != nil {
			a.stepFailed(w, ref, "email", err)
			return
		}
		if out.Order, err = a.steps.order(ctx, a, ref, lines); err != nil {
			a.stepFailed(w, ref, "order", err)
			return
		}
	}
	// What remains is the work between the last effect and the answer.
	pause(context.WithoutCancel(ctx), a.after)
	body, err := json.Marshal(out)
	if err != nil {
		a.fail(w, ref, "answer", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// began looks the call's record up and writes the run of the step name
// into ORDERS_runs, with whether the store held the step as done. Each
// step's function calls it before its effect.
func (a *api) began(ctx context.Context, ref, name string) error {
	lease, ok := engine.LeaseFromContext(ctx)
	if !ok {
		return errors.New("no lease in the step's context")
	}
	rec, err := a.steps.inspector.Lookup(ctx, lease.ID)
	if err != nil {
		return fmt.Errorf("looking the record up: %w", err)
	}
	recorded := false
	for _, s := range rec.Steps {
		if s.Name == name && s.Done {
			recorded = true
		}
	}
	if recorded {
		log.Printf("crashserver: order %s: step %q runs, but the store holds it as done", ref, name)
	}
	_, err = a.pool.Exec(ctx, a.steps.insertRun, ref, name, recorded, lease.Abandoned)
	return err
}

// charge sends the order to the payment service through the client, with
// ctx: inside a step the client derives the key from the step's name.
func (a *api) charge(ctx context.Context, in stepInput, inStep bool) (int64, error) {
	if inStep {
		if err := a.began(ctx, in.Ref, "charge"); err != nil {
			return 0, err
		}
	}
	body, err := json.Marshal(map[string]any{"ref": in.Ref, "lines": 0})
	if err != nil {
		return 0, err
	}
	resp, err := a.downstream.client.Post(ctx, a.downstream.url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("the payment service answered %d: %s", resp.StatusCode, b)
	}
	var charged struct{ ID int64 }
	if err := json.Unmarshal(b, &charged); err != nil {
		return 0, fmt.Errorf("the payment service's answer: %w", err)
	}
	return charged.ID, nil
}

// email writes the email's row, then waits for the mail server's answer
// (-step). Once the row is there, the email is sent: the function reports
// no error after it, for a step that returns an error runs again.
func (a *api) email(ctx context.Context, ref string, inStep bool) (int64, error) {
	if inStep {
		if err := a.began(ctx, ref, "email"); err != nil {
			return 0, err
		}
	}
	var id int64
	// A row inserted on a context cut short may be in the table all the
	// same: the insert is not cancelled, as a mail server does not take a
	// message back.
	if err := a.pool.QueryRow(context.WithoutCancel(ctx), a.steps.insertEmail, ref).Scan(&id); err != nil {
		return 0, err
	}
	pause(context.WithoutCancel(ctx), a.step)
	return id, nil
}

// writeOrder writes the order and its lines in a transaction of its own,
// committed before it returns.
func (a *api) writeOrder(ctx context.Context, ref string, lines int) (int64, error) {
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	id, err := a.orderRows(ctx, tx, ref, lines)
	if err != nil {
		return 0, err
	}
	// A commit cut short by the context may have been applied all the
	// same, and would be run again.
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		return 0, err
	}
	return id, nil
}

// orderRows writes the order and its lines in tx, pausing -step before each
// line.
func (a *api) orderRows(ctx context.Context, tx pgx.Tx, ref string, lines int) (int64, error) {
	lease, _ := engine.LeaseFromContext(ctx)
	var id int64
	if err := tx.QueryRow(ctx, a.insertOrder, ref, lines, lease.Abandoned).Scan(&id); err != nil {
		return 0, err
	}
	for n := range lines {
		if !pause(ctx, a.step) {
			return 0, context.Cause(ctx)
		}
		if _, err := tx.Exec(ctx, a.insertLine, id, n); err != nil {
			return 0, err
		}
	}
	return id, nil
}

// plainOrder is the "order" step where the records are not in PostgreSQL:
// its function commits a transaction of its own, and the step's record is
// stored after the commit.
func plainOrder(ctx context.Context, a *api, ref string, lines int) (int64, error) {
	return step.Run(ctx, "order", stepInput{Ref: ref, Lines: lines}, func(ctx context.Context) (int64, error) {
		if err := a.began(ctx, ref, "order"); err != nil {
			return 0, err
		}
		return a.writeOrder(ctx, ref, lines)
	})
}

// stepFailed answers an order whose step failed: the final "outcome
// unknown" 409, naming the step, for a step started by a lost holder
// (engine.ErrOutcomeUnknown); 503 otherwise, which releases the key, so
// that the retry resumes.
func (a *api) stepFailed(w http.ResponseWriter, ref, name string, err error) {
	if !errors.Is(err, engine.ErrOutcomeUnknown) {
		a.fail(w, ref, name, err)
		return
	}
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Code   string `json:"code"`
		Detail string `json:"detail"`
		Step   string `json:"step"`
	}{
		Type: wire.TypeOutcomeUnknown, Title: "Outcome unknown", Status: http.StatusConflict, Code: wire.CodeOutcomeUnknown,
		Detail: "The step " + strconv.Quote(name) + " was started by an earlier attempt that was interrupted; whether it took effect is unknown.",
		Step:   name,
	})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusConflict)
	w.Write(body)
}
