package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/pgstore"
)

// TestTransactionalInterrupted interrupts, over HTTP, a handler of
// pgstore's transactional mode between its business write and the
// completion, in every way the issue names, and checks that no retry ever
// sees half an order: before the retry there is no order; the retry makes
// exactly one; the replay after it makes none.
func TestTransactionalInterrupted(t *testing.T) {
	pool := teststores.PostgresPool(t, 32)
	store := teststores.PostgresOn(t, pool, teststores.UniqueName(t, "idempotency_tx_"), pgstore.WithTransactions())
	orders := pgx.Identifier{teststores.UniqueName(t, "orders_")}.Sanitize()
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id serial PRIMARY KEY, ref text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+orders) })

	written := make(chan struct{}, 1) // the business write is done
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := pgstore.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		var in struct{ Ref string }
		json.NewDecoder(r.Body).Decode(&in)
		var id int
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+orders+" (ref) VALUES ($1) RETURNING id", in.Ref).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		switch r.Header.Get("X-Interrupt") {
		case "5xx":
			w.WriteHeader(http.StatusBadGateway)
			return
		case "panic":
			panic("after the business write")
		case "killed":
			// The transaction's connection dies; the handler does not
			// notice and answers success.
			pid := tx.Conn().PgConn().PID()
			if _, err := pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		case "cancelled":
			// The client goes away while a statement runs.
			written <- struct{}{}
			_, err := tx.Exec(r.Context(), "SELECT pg_sleep(30)")
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		case "gone":
			// The client goes away after the write; the handler
			// finishes its work all the same.
			written <- struct{}{}
			<-r.Context().Done()
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]int{"id": id})
	})
	mw, err := server.New(store)
	require.NoError(t, err)
	srv := startServer(t, mw.Handler(h))

	count := func(ref string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+orders+" WHERE ref = $1", ref).Scan(&n))
		return n
	}
	// A fresh connection per request: net/http would quietly resend a
	// keyed request that failed on a reused one.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	send := func(ctx context.Context, ref, key, interrupt string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"ref":"`+ref+`"}`))
		req.Header.Set("Idempotency-Key", key)
		if interrupt != "" {
			req.Header.Set("X-Interrupt", interrupt)
		}
		return client.Do(req)
	}

	for _, tc := range []struct {
		interrupt  string
		wantStatus int // of the interrupted request; 0: no response
		committed  bool
	}{
		{"5xx", http.StatusBadGateway, false},
		{"panic", 0, false},
		{"killed", http.StatusServiceUnavailable, false},
		{"cancelled", 0, false},
		{"gone", 0, true},
	} {
		t.Run(tc.interrupt, func(t *testing.T) {
			ref, key := "ref-"+tc.interrupt, "key-"+tc.interrupt
			reqCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			if tc.interrupt == "cancelled" || tc.interrupt == "gone" {
				go func() {
					<-written
					cancel()
				}()
			}
			resp, err := send(reqCtx, ref, key, tc.interrupt)
			if tc.wantStatus == 0 {
				require.Error(t, err, "the interrupted request must get no response")
			} else {
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				require.Equal(t, tc.wantStatus, resp.StatusCode)
			}

			// Retry until the key is free or its outcome is stored:
			// the interrupted request may still be finishing.
			var first string
			deadline := time.Now().Add(20 * time.Second)
			for {
				if !tc.committed {
					// Nothing of the interrupted request is visible,
					// whether it has ended yet or not.
					require.Equal(t, 0, count(ref), "half an order is visible before the retry ran")
				}
				resp, err := send(ctx, ref, key, "")
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					first = string(body)
					break
				}
				require.Equal(t, http.StatusConflict, resp.StatusCode, "retry: %s", body)
				require.True(t, time.Now().Before(deadline), "the key stayed in flight")
			}
			assert.Equal(t, 1, count(ref), "orders after the retry")
			resp, err = send(ctx, ref, key, "")
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
			assert.Equal(t, first, string(body))
			assert.Equal(t, 1, count(ref), "orders after the replay")
		})
	}
}
