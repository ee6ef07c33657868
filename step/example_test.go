package step_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/once"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/memstore"
)

// A handler whose email fails after the charge: its 5xx releases the key,
// and the client's retry, with the same key, resumes after the charge.
func Example() {
	var charges, emails int
	mailDown := true // the first attempt's email fails
	handler := func(w http.ResponseWriter, r *http.Request) {
		receipt, err := step.Run(r.Context(), "charge", "order-7", func(ctx context.Context) (string, error) {
			charges++ // a payment API called with the client: its key derives from "charge"
			return "receipt-1", nil
		})
		if err == nil {
			_, err = step.Run(r.Context(), "email", receipt, func(ctx context.Context) (bool, error) {
				if mailDown {
					return false, errors.New("mail server down")
				}
				emails++
				return true, nil
			})
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway) // a 5xx releases the key: the retry resumes
			return
		}
		fmt.Fprintln(w, receipt, "emailed")
	}
	postTwice(handler, func() { mailDown = false }) // behind server.New(store), with one key
	fmt.Println("charges:", charges, "emails:", emails)
	// Output:
	// 502 mail server down
	// 200 receipt-1 emailed
	// charges: 1 emails: 1
}

// postTwice serves handler behind the middleware on the embedded store,
// and posts one order to it twice with one key, calling between before
// the second.
func postTwice(handler http.HandlerFunc, between func()) {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	mw, err := server.New(store)
	if err != nil {
		log.Fatal(err)
	}
	h := mw.Handler(handler)
	for i := range 2 {
		if i == 1 {
			between()
		}
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"A1"}`))
		req.Header.Set("Idempotency-Key", "4f1c2a9e-order-7")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
}

// Under the function door: a job that failed after its first step is run
// again by the queue, and resumes.
func Example_function() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	r, err := once.New(store)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Shutdown(context.Background())

	exports, uploads := 0, 0
	job := func(ctx context.Context) (string, error) {
		file, err := step.Run(ctx, "export", "2026-12", func(ctx context.Context) (string, error) {
			exports++ // minutes of work
			return "export-2026-12.csv", nil
		})
		if err != nil {
			return "", err
		}
		return step.Run(ctx, "upload", file, func(ctx context.Context) (string, error) {
			if uploads++; uploads == 1 {
				return "", errors.New("bucket unreachable") // the job fails; its key is released
			}
			return "s3://reports/" + file, nil
		})
	}
	id := engine.ID{Scope: "reports", Key: "monthly-2026-12"}
	for range 2 { // the queue runs the job again
		url, err := once.Do(context.Background(), r, id, "2026-12", job)
		fmt.Println(url, err)
	}
	fmt.Println("exports:", exports, "uploads:", uploads)
	// Output:
	//  bucket unreachable
	// s3://reports/export-2026-12.csv <nil>
	// exports: 1 uploads: 2
}
