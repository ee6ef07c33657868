package e2e_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
)

// TestTwoInstances runs two instances of an API, each with its own
// middleware and its own connections, on one shared store: concurrent
// identical requests spread over both run once.
func TestTwoInstances(t *testing.T) {
	pairs := map[string]func(t *testing.T) (engine.Store, engine.Store){
		"postgres": func(t *testing.T) (engine.Store, engine.Store) {
			table := teststores.UniqueName(t, "idempotency_two_")
			a := teststores.PostgresOn(t, teststores.PostgresPool(t, 32), table)
			b := teststores.PostgresOn(t, teststores.PostgresPool(t, 32), table)
			return a, b
		},
		"redis": func(t *testing.T) (engine.Store, engine.Store) {
			prefix := teststores.UniqueName(t, "idempotency-two:") + ":"
			a := teststores.RedisOn(t, teststores.RedisClient(t), prefix)
			b := teststores.RedisOn(t, teststores.RedisClient(t), prefix)
			return a, b
		},
	}
	for name, pair := range pairs {
		t.Run(name, func(t *testing.T) {
			storeA, storeB := pair(t)
			var executions atomic.Int64
			started := make(chan struct{}, 1)
			release := make(chan struct{})
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := executions.Add(1)
				started <- struct{}{}
				<-release
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "order "+string(rune('0'+n)))
			})
			var urls []string
			for _, s := range []engine.Store{storeA, storeB} {
				mw, err := server.New(s)
				require.NoError(t, err)
				urls = append(urls, startServer(t, mw.Handler(h)).URL)
			}
			const n = 100
			tr := &http.Transport{MaxIdleConnsPerHost: n}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			statuses := make(chan int, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, urls[i%2], strings.NewReader(`{"sku":"A"}`))
					req.Header.Set("Idempotency-Key", "shared-key")
					resp, err := client.Do(req)
					if err != nil {
						statuses <- -1
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					statuses <- resp.StatusCode
				})
			}
			<-started
			// The original holds its lease until every duplicate, on
			// either instance, has been answered.
			for range n - 1 {
				assert.Equal(t, http.StatusConflict, <-statuses)
			}
			close(release)
			wg.Wait()
			assert.Equal(t, http.StatusCreated, <-statuses)
			assert.Equal(t, int64(1), executions.Load(), "executions across both instances")
			for _, u := range urls {
				req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(`{"sku":"A"}`))
				req.Header.Set("Idempotency-Key", "shared-key")
				resp, err := client.Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				assert.Equal(t, "order 1", string(body))
				assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
			}
		})
	}
}
