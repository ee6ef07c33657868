package crash_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/testproc"
)

// TestMemstoreCrash shows the limit of the memory store: its records are the
// process's memory, so a restart forgets every one, and a retry of an order
// answered before the crash runs it again, whatever the abandoned policy,
// since there is no claim left to take over.
func TestMemstoreCrash(t *testing.T) {
	bin := testproc.Build(t, "github.com/idemkit/idempotency/internal/tests/crash/crashserver")
	const orders = 20
	for _, policy := range []string{"rerun", "refuse"} {
		t.Run(policy, func(t *testing.T) {
			r := newCrashRun(t, bin, "mem-lease", size{})
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
			// Before the crash, the same orders are replays.
			assert.Equal(t, first, sendAll(true))
			proc.Kill()
			plain.CloseIdleConnections()
			r.start(t)
			again := sendAll(false)

			var res result
			r.count(t, &res, again)
			t.Logf("%s: %d orders answered before the kill, sent again after the restart: %d executions, %d orders run twice",
				policy, orders, res.executions, res.duplicatedOrders)
			assert.Equal(t, 2*orders, res.executions, "executions: every order once before the crash and once after")
			assert.Equal(t, orders, res.duplicatedOrders, "orders run twice")
			assert.NotEqual(t, first, again, "the answers after the restart are new orders")
		})
	}
}
