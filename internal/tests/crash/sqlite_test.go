package crash_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/testproc"
)

// TestSQLiteRestart is TestMemstoreCrash on the SQLite store: the records
// are in a file, which the restarted process opens again, so every order
// answered before the kill is a replay after it, whatever the abandoned
// policy.
func TestSQLiteRestart(t *testing.T) {
	bin := testproc.Build(t, "github.com/idemkit/idempotency/internal/tests/crash/crashserver")
	const orders = 20
	for _, policy := range []string{"rerun", "refuse"} {
		t.Run(policy, func(t *testing.T) {
			r := newCrashRun(t, bin, "sqlite-lease", size{})
			r.args = append(r.args, "-abandoned", policy)
			ctx := context.Background()
			plain := &http.Transport{}
			defer plain.CloseIdleConnections()
			hc := &http.Client{Transport: plain}
			url := "http://" + r.addr + "/orders"
			sendAll := func(wantReplayed bool) map[int]string {
				answers := map[int]string{}
				for i := range orders {
					body, replayed, err := send(ctx, hc, url, i)
					require.NoError(t, err)
					require.Equal(t, wantReplayed, replayed, "order %d: %s", i, body)
					answers[i] = body
				}
				return answers
			}

			proc := r.start(t)
			first := sendAll(false)
			proc.Kill()
			plain.CloseIdleConnections()
			r.start(t)
			again := sendAll(true)

			var res result
			r.count(t, &res, again)
			t.Logf("%s: %d orders answered before the kill, sent again after the restart: %d executions, %d orders run twice",
				policy, orders, res.executions, res.duplicatedOrders)
			assert.Equal(t, orders, res.executions, "executions: every order once, before the crash")
			assert.Zero(t, res.duplicatedOrders, "orders run twice")
			assert.Equal(t, first, again, "the answers after the restart are the replays of the first")
		})
	}
}
