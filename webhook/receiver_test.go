package webhook_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/webhook"
)

// newReceiver returns a receiver of Standard Webhooks deliveries on store,
// shut down when t ends.
func newReceiver(t *testing.T, store engine.Store, opts ...webhook.Option) *webhook.Receiver {
	t.Helper()
	rc, err := webhook.New(store, webhook.StandardWebhooks(standardSecret), opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, rc.Shutdown(ctx))
	})
	return rc
}

// serve starts a server of rc over h, closed when t ends.
func serve(t *testing.T, rc *webhook.Receiver, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(rc.Handler(h))
	t.Cleanup(srv.Close)
	return srv.URL
}

// answer is what a delivery got.
type answer struct {
	status   int
	replayed bool
	body     string
	header   http.Header
}

// deliver signs body for id with the Standard Webhooks library, as the
// sender does at every attempt, and posts it to url.
func deliver(t *testing.T, url, id string, body []byte) answer {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(standardSecret)
	require.NoError(t, err)
	now := time.Now()
	sig, err := wh.Sign(id, now, body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: string(b), header: resp.Header}
}

// effects counts the handler's runs per delivery id.
type effects struct {
	mu   sync.Mutex
	runs map[string]int
}

func (e *effects) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.runs == nil {
		e.runs = map[string]int{}
	}
	e.runs[id]++
}

func (e *effects) of(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[id]
}

// counting is a handler that counts its runs by the lease's key, and
// answers 200 "done".
func counting(e *effects) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, ok := engine.LeaseFromContext(r.Context())
		if !ok {
			http.Error(w, "no lease", http.StatusInternalServerError)
			return
		}
		e.add(l.Key)
		io.WriteString(w, "done")
	})
}

// TestDuplicateOfDoneDelivery: on every store, the first delivery runs the
// handler and gets its answer; every later one gets the 2xx at once,
// without a body, and the handler does not run again.
func TestDuplicateOfDoneDelivery(t *testing.T) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			var e effects
			url := serve(t, newReceiver(t, kind.New(t)), counting(&e))
			first := deliver(t, url, "msg_1", payload)
			assert.Equal(t, http.StatusOK, first.status)
			assert.Equal(t, "done", first.body)
			assert.False(t, first.replayed)
			for range 3 {
				again := deliver(t, url, "msg_1", payload)
				assert.Equal(t, http.StatusOK, again.status)
				assert.True(t, again.replayed)
				assert.Empty(t, again.body)
			}
			assert.Equal(t, 1, e.of("msg_1"))
			assert.Equal(t, http.StatusOK, deliver(t, url, "msg_2", payload).status)
			assert.Equal(t, 1, e.of("msg_2"))
		})
	}
}

// blocked is a handler that counts its runs and answers 202 once release is
// closed; entered receives once per run.
func blocked(e *effects, entered chan<- struct{}, release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l, _ := engine.LeaseFromContext(r.Context())
		e.add(l.Key)
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusAccepted)
	})
}

// TestDuplicateWaitsForOriginal: a duplicate that arrives while the
// original runs waits for it and gets its 2xx, never a 409.
func TestDuplicateWaitsForOriginal(t *testing.T) {
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			store := faultstore.New(kind.New(t))
			var e effects
			entered, release := make(chan struct{}, 2), make(chan struct{})
			url := serve(t, newReceiver(t, store), blocked(&e, entered, release))
			answers := make(chan answer, 2)
			go func() { answers <- deliver(t, url, "msg_wait", payload) }()
			<-entered
			go func() { answers <- deliver(t, url, "msg_wait", payload) }()
			// The duplicate has asked the store, and found the original
			// in flight.
			require.Eventually(t, func() bool { return store.Calls(faultstore.Claim) >= 2 }, 5*time.Second, time.Millisecond)
			close(release)
			a, b := <-answers, <-answers
			assert.Equal(t, http.StatusAccepted, a.status)
			assert.Equal(t, http.StatusAccepted, b.status)
			assert.True(t, a.replayed != b.replayed, "one answer is the original's, the other its replay")
			assert.Equal(t, 1, e.of("msg_wait"))
		})
	}
}

// TestDuplicateBeyondWait: a duplicate whose original outlasts the wait is
// answered 503 with Retry-After, which the sender retries, never 409; a
// negative Wait answers it at once.
func TestDuplicateBeyondWait(t *testing.T) {
	for _, wait := range []time.Duration{50 * time.Millisecond, -1} {
		t.Run(wait.String(), func(t *testing.T) {
			var e effects
			entered, release := make(chan struct{}, 2), make(chan struct{})
			url := serve(t, newReceiver(t, teststores.Memory(t), webhook.WithConfig(engine.Config{Wait: wait})), blocked(&e, entered, release))
			first := make(chan answer, 1)
			go func() { first <- deliver(t, url, "msg_slow", payload) }()
			<-entered
			start := time.Now()
			dup := deliver(t, url, "msg_slow", payload)
			took := time.Since(start)
			assert.Equal(t, http.StatusServiceUnavailable, dup.status)
			assert.NotEmpty(t, dup.header.Get("Retry-After"))
			if wait > 0 {
				assert.GreaterOrEqual(t, took, wait, "answered before the wait ended")
			}
			close(release)
			assert.Equal(t, http.StatusAccepted, (<-first).status)
			after := deliver(t, url, "msg_slow", payload)
			assert.Equal(t, http.StatusAccepted, after.status)
			assert.True(t, after.replayed)
			assert.Equal(t, 1, e.of("msg_slow"))
		})
	}
}

// TestHandlerFailureReleases: a handler's 5xx goes to the sender and
// releases the key, so that the retry runs the handler again; a panic
// likewise.
func TestHandlerFailureReleases(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch runs.Add(1) {
		case 1:
			http.Error(w, "database down", http.StatusInternalServerError)
		case 2:
			panic(http.ErrAbortHandler)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	url := serve(t, newReceiver(t, teststores.Memory(t)), h)
	assert.Equal(t, http.StatusInternalServerError, deliver(t, url, "msg_fail", payload).status)
	wh, err := standardwebhooks.NewWebhook(standardSecret)
	require.NoError(t, err)
	now := time.Now()
	sig, err := wh.Sign("msg_fail", now, payload)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(payload)))
	require.NoError(t, err)
	req.Header.Set("webhook-id", "msg_fail")
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	_, err = http.DefaultClient.Do(req)
	assert.Error(t, err, "the panicking handler's connection is aborted")
	assert.Equal(t, http.StatusNoContent, deliver(t, url, "msg_fail", payload).status)
	again := deliver(t, url, "msg_fail", payload)
	assert.Equal(t, http.StatusNoContent, again.status)
	assert.True(t, again.replayed)
	assert.Equal(t, int32(3), runs.Load())
}

// TestStoreFailure: a store that fails is answered 503 with Retry-After,
// and the handler does not run.
func TestStoreFailure(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	store.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("connection refused")})
	var e effects
	url := serve(t, newReceiver(t, store), counting(&e))
	a := deliver(t, url, "msg_down", payload)
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	assert.NotEmpty(t, a.header.Get("Retry-After"))
	assert.Equal(t, 0, e.of("msg_down"))
	store.Clear(faultstore.Claim)
	assert.Equal(t, http.StatusOK, deliver(t, url, "msg_down", payload).status)
	assert.Equal(t, 1, e.of("msg_down"))
}

// forgeries are requests that a receiver of standardSecret must refuse,
// each with its status.
func forgeries(t *testing.T, i int) (*http.Request, int) {
	t.Helper()
	id := "msg_forged_" + strconv.Itoa(i)
	now := time.Now()
	wh, err := standardwebhooks.NewWebhook(standardOtherSecret)
	require.NoError(t, err)
	good, err := standardwebhooks.NewWebhook(standardSecret)
	require.NoError(t, err)
	at, body, status := now, payload, http.StatusUnauthorized
	signer := wh
	switch i % 4 {
	case 1: // tampered
		signer = good
	case 2: // stale
		signer, at = good, now.Add(-time.Hour)
	case 3: // no signature at all
		status = http.StatusBadRequest
	}
	sig, err := signer.Sign(id, at, payload)
	require.NoError(t, err)
	if i%4 == 1 {
		body = []byte(strings.Replace(string(payload), "2000", "9000", 1))
	}
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	if i%4 != 3 {
		req.Header.Set("webhook-signature", sig)
	}
	return req, status
}

// TestForgedFloodWritesNothing: on every store, a flood of forged
// deliveries (wrong secret, tampered body, stale timestamp, no signature)
// is refused without a single store call, and leaves no record.
func TestForgedFloodWritesNothing(t *testing.T) {
	n := 400
	if *redeliveryLong {
		n = 10000
	}
	for _, kind := range teststores.All() {
		t.Run(kind.Name, func(t *testing.T) {
			inner := kind.New(t)
			store := faultstore.New(inner)
			var e effects
			rc := newReceiver(t, store)
			h := rc.Handler(counting(&e))
			for i := range n {
				req, want := forgeries(t, i)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				require.Equal(t, want, w.Code, "forgery %d", i)
			}
			for _, op := range []faultstore.Op{faultstore.Claim, faultstore.Complete, faultstore.Release, faultstore.Extend} {
				assert.Zero(t, store.Calls(op), "%v calls", op)
			}
			insp := inner.(engine.Inspector)
			for i := range n {
				_, err := insp.Lookup(context.Background(), engine.ID{Scope: "webhook/standard-webhooks/default", Key: "msg_forged_" + strconv.Itoa(i)})
				require.ErrorIs(t, err, engine.ErrNotFound)
			}
			e.mu.Lock()
			assert.Empty(t, e.runs)
			e.mu.Unlock()
			t.Logf("%s: %d forged deliveries refused, %d store calls, 0 records", kind.Name, n,
				store.Calls(faultstore.Claim)+store.Calls(faultstore.Complete)+store.Calls(faultstore.Release)+store.Calls(faultstore.Extend))
		})
	}
}

// TestRefusedBeforeVerification: a method other than POST and a body over
// the limit are refused before verification, and claim nothing.
func TestRefusedBeforeVerification(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	sender := webhook.StandardWebhooks(standardSecret)
	sender.MaxBody = 64
	rc, err := webhook.New(store, sender)
	require.NoError(t, err)
	var e effects
	h := rc.Handler(counting(&e))

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusMethodNotAllowed, w.Code)
	assert.Equal(t, http.MethodPost, w.Header().Get("Allow"))

	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 65))))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)

	req := httptest.NewRequest(http.MethodPost, "/", io.MultiReader(strings.NewReader(strings.Repeat("x", 100))))
	req.ContentLength = -1
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Zero(t, store.Calls(faultstore.Claim))
}

// TestEndpointsScope: one event delivered to two endpoints that share a
// store runs at both; the same delivery twice at one endpoint runs once.
func TestEndpointsScope(t *testing.T) {
	store := teststores.Memory(t)
	var billing, audit effects
	u1 := serve(t, newReceiver(t, store, webhook.WithEndpoint("billing")), counting(&billing))
	u2 := serve(t, newReceiver(t, store, webhook.WithEndpoint("audit")), counting(&audit))
	for range 2 {
		assert.Equal(t, http.StatusOK, deliver(t, u1, "msg_fan", payload).status)
		assert.Equal(t, http.StatusOK, deliver(t, u2, "msg_fan", payload).status)
	}
	assert.Equal(t, 1, billing.of("msg_fan"))
	assert.Equal(t, 1, audit.of("msg_fan"))
}

// TestKeep: WithKeep decides which statuses are stored; a status not kept
// releases the key.
func TestKeep(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusUnprocessableEntity)
	})
	store := teststores.Memory(t)
	released := serve(t, newReceiver(t, store, webhook.WithEndpoint("a")), h)
	assert.Equal(t, http.StatusUnprocessableEntity, deliver(t, released, "msg_k", payload).status)
	assert.Equal(t, http.StatusUnprocessableEntity, deliver(t, released, "msg_k", payload).status)
	assert.Equal(t, int32(2), runs.Load())

	kept := serve(t, newReceiver(t, store, webhook.WithEndpoint("b"), webhook.WithKeep(func(s int) bool { return s < 500 })), h)
	assert.Equal(t, http.StatusUnprocessableEntity, deliver(t, kept, "msg_k", payload).status)
	again := deliver(t, kept, "msg_k", payload)
	assert.Equal(t, http.StatusUnprocessableEntity, again.status)
	assert.True(t, again.replayed)
	assert.Equal(t, int32(3), runs.Load())
}

// TestNewRefuses: New names every invalid part of its configuration.
func TestNewRefuses(t *testing.T) {
	store := teststores.Memory(t)
	_, err := webhook.New(store, webhook.Sender{Name: "a/b", TTL: -1}, webhook.WithEndpoint(""), nil, webhook.WithKeep(nil))
	require.Error(t, err)
	for _, want := range []string{"sender name", "Verify", "ID function", "TTL", "endpoint name", "option 1 is nil", "WithKeep"} {
		assert.Contains(t, err.Error(), want)
	}
	for _, s := range []webhook.Sender{webhook.StandardWebhooks(), webhook.StandardWebhooks("whsec_***"), webhook.Stripe(), webhook.GitHub(""), webhook.Shopify(), webhook.GitLab()} {
		_, err := webhook.New(store, s)
		assert.Error(t, err, s.Name)
	}
	_, err = webhook.New(store, webhook.Stripe("whsec_x"), webhook.WithConfig(engine.Config{Lease: time.Hour, TTL: time.Minute}))
	assert.ErrorContains(t, err, "lease")
	_, err = webhook.New(nil, webhook.Stripe("whsec_x"))
	assert.Error(t, err)
}

// TestAbandonedHolder: a delivery whose earlier holder was lost (its lease
// ran out without an answer) runs again by default; under
// engine.RefuseAbandoned it is answered 500, marked "Idempotent-Outcome:
// unknown", never 409, and the sender's retries get the same until an
// operator resolves the key.
func TestAbandonedHolder(t *testing.T) {
	for _, policy := range []engine.AbandonedPolicy{engine.RerunAbandoned, engine.RefuseAbandoned} {
		t.Run(strconv.Itoa(int(policy)), func(t *testing.T) {
			store := teststores.Memory(t)
			id := engine.ID{Scope: "webhook/standard-webhooks/default", Key: "msg_lost"}
			// A holder that claimed the delivery, then died: its
			// lease runs out, unanswered.
			_, err := store.Claim(context.Background(), id, "webhook", 10*time.Millisecond, time.Hour)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				rec, err := store.Lookup(context.Background(), id)
				return err == nil && time.Now().After(rec.LeaseEnds)
			}, 5*time.Second, time.Millisecond)
			var e effects
			url := serve(t, newReceiver(t, store, webhook.WithConfig(engine.Config{Abandoned: policy})), counting(&e))
			for range 2 {
				a := deliver(t, url, "msg_lost", payload)
				if policy == engine.RerunAbandoned {
					assert.Equal(t, http.StatusOK, a.status)
					continue
				}
				assert.Equal(t, http.StatusInternalServerError, a.status)
				assert.Equal(t, "unknown", a.header.Get(engine.HeaderOutcome))
			}
			want := 0
			if policy == engine.RerunAbandoned {
				want = 1
			}
			assert.Equal(t, want, e.of("msg_lost"))
		})
	}
}
