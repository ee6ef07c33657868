package webhook_test

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/webhook"
)

// TestInvalidStatusIsNotKept: a handler that writes a status code net/http
// refuses (it panics on one, and the sender retries) is answered 500 and
// its key released, even under a WithKeep that keeps everything: kept as
// the 200 it would default to, the delivery would be lost.
func TestInvalidStatusIsNotKept(t *testing.T) {
	for name, write := range map[string]func(w http.ResponseWriter){
		"0":           func(w http.ResponseWriter) { w.WriteHeader(0); w.Write([]byte("x")) },
		"1000":        func(w http.ResponseWriter) { w.WriteHeader(1000) },
		"99":          func(w http.ResponseWriter) { w.WriteHeader(99) },
		"200 then -1": func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK); w.WriteHeader(-1) },
		"body then 0": func(w http.ResponseWriter) { w.Write([]byte("x")); w.WriteHeader(0) },
	} {
		for _, keepAll := range []bool{false, true} {
			t.Run(name+"/keep all "+strconv.FormatBool(keepAll), func(t *testing.T) {
				var opts []webhook.Option
				if keepAll {
					opts = append(opts, webhook.WithKeep(func(int) bool { return true }))
				}
				var runs atomic.Int32
				url := serve(t, newReceiver(t, teststores.Memory(t), opts...), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					write(w)
				}))
				for range 2 {
					a := deliver(t, url, "msg_invalid", payload)
					assert.Equal(t, http.StatusInternalServerError, a.status)
					assert.False(t, a.replayed)
				}
				assert.Equal(t, int32(2), runs.Load())
			})
		}
	}
}
