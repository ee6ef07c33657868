package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/webhook"
)

// events collects an Observer's events.
type events struct {
	mu sync.Mutex
	ev []engine.Event
	ch chan engine.Event
}

func newEvents() *events { return &events{ch: make(chan engine.Event, 64)} }

func (e *events) observe(_ context.Context, ev engine.Event) {
	e.mu.Lock()
	e.ev = append(e.ev, ev)
	e.mu.Unlock()
	select {
	case e.ch <- ev:
	default:
	}
}

// next returns the next event of kind, or fails after a generous bound.
func (e *events) next(t *testing.T, kind engine.EventKind) engine.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-e.ch:
			if ev.Kind == kind {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %v event", kind)
			return engine.Event{}
		}
	}
}

// TestAttackMaxBodyOne: a MaxBody of 1 takes a body of one byte and
// refuses two, declared or not, before anything is claimed.
func TestAttackMaxBodyOne(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	sender := webhook.StandardWebhooks(standardSecret)
	sender.MaxBody = 1
	rc, err := webhook.New(store, sender)
	require.NoError(t, err)
	var e effects
	h := rc.Handler(counting(&e))
	assert.Equal(t, http.StatusOK, serveDirect(h, standardRequest(t, "http://hooks.test/", "msg_one", []byte("x"))).Code)
	assert.Equal(t, http.StatusRequestEntityTooLarge, serveDirect(h, standardRequest(t, "http://hooks.test/", "msg_two", []byte("xy"))).Code)
	req := standardRequest(t, "http://hooks.test/", "msg_two", []byte("xy"))
	req.ContentLength = -1
	assert.Equal(t, http.StatusRequestEntityTooLarge, serveDirect(h, req).Code)
	assert.Equal(t, 1, store.Calls(faultstore.Claim))
}

// TestAttackStoreFaults: each store call failing, hanging, slow, or
// answering its write after its answer was lost: the handler runs once per
// delivery in the end, the sender never gets a 409, and a 2xx only for a
// delivery that ran.
func TestAttackStoreFaults(t *testing.T) {
	cfg := engine.Config{StoreTimeout: 100 * time.Millisecond, Lease: 2 * time.Second}
	boom := errors.New("connection reset")
	cases := []struct {
		name  string
		op    faultstore.Op
		fault faultstore.Fault
		// first is what the first delivery gets.
		first int
	}{
		{"claim fails", faultstore.Claim, faultstore.Fault{Err: boom}, http.StatusServiceUnavailable},
		{"claim hangs", faultstore.Claim, faultstore.Fault{Hang: true}, http.StatusServiceUnavailable},
		{"claim slow", faultstore.Claim, faultstore.Fault{Delay: 20 * time.Millisecond}, http.StatusOK},
		{"complete fails", faultstore.Complete, faultstore.Fault{Err: boom}, http.StatusOK},
		{"complete hangs", faultstore.Complete, faultstore.Fault{Hang: true}, http.StatusOK},
		{"complete answer lost", faultstore.Complete, faultstore.Fault{ErrAfter: boom}, http.StatusOK},
		{"extend fails", faultstore.Extend, faultstore.Fault{Err: boom}, http.StatusOK},
		{"release fails", faultstore.Release, faultstore.Fault{Err: boom}, http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := faultstore.New(teststores.Memory(t))
			store.Set(c.op, c.fault)
			var e effects
			url := serve(t, newReceiver(t, store, webhook.WithConfig(cfg)), counting(&e))
			a := deliver(t, url, "msg_fault", payload)
			assert.Equal(t, c.first, a.status)
			if a.status == http.StatusServiceUnavailable {
				assert.NotEmpty(t, a.header.Get("Retry-After"))
			}
			store.Clear(c.op)
			require.Eventually(t, func() bool {
				a := deliver(t, url, "msg_fault", payload)
				assert.NotEqual(t, http.StatusConflict, a.status)
				return a.status == http.StatusOK && a.replayed
			}, 10*time.Second, 20*time.Millisecond)
			assert.Equal(t, 1, e.of("msg_fault"))
		})
	}
}

// TestAttackStoreAnswersAfterItsDeadline: a Claim that ignores its
// context and grants the lease after the store timeout: the delivery runs
// once at most while the lease holds, and once in the end.
func TestAttackStoreAnswersAfterItsDeadline(t *testing.T) {
	inner := teststores.Memory(t)
	late := &lateClaim{Store: inner, delay: 150 * time.Millisecond}
	late.on.Store(true)
	var e effects
	url := serve(t, newReceiver(t, late, webhook.WithConfig(engine.Config{StoreTimeout: 50 * time.Millisecond, Lease: 300 * time.Millisecond})), counting(&e))
	a := deliver(t, url, "msg_late", payload)
	assert.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, a.status)
	late.on.Store(false)
	require.Eventually(t, func() bool {
		a := deliver(t, url, "msg_late", payload)
		return a.status == http.StatusOK && a.replayed
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1, e.of("msg_late"))
}

// lateClaim makes Claim answer after delay whatever its context says.
type lateClaim struct {
	engine.Store
	delay time.Duration
	on    atomic.Bool
}

func (s *lateClaim) Claim(ctx context.Context, id engine.ID, fp string, lease, ttl time.Duration) (engine.Claim, error) {
	if s.on.Load() {
		time.Sleep(s.delay)
		return s.Store.Claim(context.WithoutCancel(ctx), id, fp, lease, ttl)
	}
	return s.Store.Claim(ctx, id, fp, lease, ttl)
}

// TestAttackStoreTimeoutTiny: a store timeout no store can meet fails
// closed: 503 with Retry-After, and the handler never runs.
func TestAttackStoreTimeoutTiny(t *testing.T) {
	var e effects
	url := serve(t, newReceiver(t, teststores.Memory(t), webhook.WithConfig(engine.Config{StoreTimeout: time.Nanosecond})), counting(&e))
	for range 3 {
		a := deliver(t, url, "msg_tiny", payload)
		assert.Equal(t, http.StatusServiceUnavailable, a.status)
		assert.NotEmpty(t, a.header.Get("Retry-After"))
	}
	assert.Equal(t, 0, e.of("msg_tiny"))
}

// TestAttackConfigBounds: TTL and Wait at their extremes are accepted and
// work.
func TestAttackConfigBounds(t *testing.T) {
	for _, cfg := range []engine.Config{
		{TTL: engine.MinLease},
		{TTL: math.MaxInt64},
		{Wait: math.MaxInt64},
		{Wait: math.MinInt64},
		{Lease: engine.MinLease},
	} {
		var e effects
		url := serve(t, newReceiver(t, teststores.Memory(t), webhook.WithConfig(cfg)), counting(&e))
		a := deliver(t, url, "msg_cfg", payload)
		assert.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, a.status, "%+v", cfg)
		assert.LessOrEqual(t, e.of("msg_cfg"), 1)
	}
	_, err := webhook.New(teststores.Memory(t), webhook.StandardWebhooks(standardSecret), webhook.WithConfig(engine.Config{TTL: -1}))
	assert.Error(t, err)
	_, err = webhook.New(teststores.Memory(t), webhook.StandardWebhooks(standardSecret), webhook.WithConfig(engine.Config{StoreTimeout: -1}))
	assert.Error(t, err)
}

// TestAttackWaitingDuplicateSenderLeaves: a duplicate waiting under a huge
// Wait whose sender goes away stops waiting, and leaves nothing behind.
func TestAttackWaitingDuplicateSenderLeaves(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	ev := newEvents()
	var e effects
	entered, release := make(chan struct{}, 2), make(chan struct{})
	url := serve(t, newReceiver(t, store, webhook.WithConfig(engine.Config{Wait: 100 * time.Hour, Observer: ev.observe})), blocked(&e, entered, release))
	first := make(chan answer, 1)
	go func() { first <- deliver(t, url, "msg_leave", payload) }()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		req := standardRequest(t, url, "msg_leave", payload)
		_, err := http.DefaultClient.Do(req.WithContext(ctx))
		gone <- err
	}()
	require.Eventually(t, func() bool { return store.Calls(faultstore.Claim) >= 3 }, 5*time.Second, time.Millisecond)
	cancel()
	assert.Error(t, <-gone)
	ev.next(t, engine.EventClientGone)
	close(release)
	assert.Equal(t, http.StatusAccepted, (<-first).status)
	assert.Equal(t, 1, e.of("msg_leave"))
}

// TestAttackHandlerAnswers: what the handler writes, or does not, decides
// what is kept, and the sender gets the handler's own answer.
func TestAttackHandlerAnswers(t *testing.T) {
	cases := []struct {
		name   string
		h      func(w http.ResponseWriter, r *http.Request)
		status int
		kept   bool
	}{
		{"writes nothing", func(http.ResponseWriter, *http.Request) {}, http.StatusOK, true},
		{"writes 409", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusConflict) }, http.StatusConflict, false},
		{"writes 103 then 204", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusNoContent)
		}, http.StatusNoContent, true},
		{"flushes", func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "part")
			err := http.NewResponseController(w).Flush()
			if err == nil {
				return
			}
			// Nothing went out before the record: the answer is held.
			assert.ErrorIs(t, err, http.ErrNotSupported)
		}, http.StatusOK, true},
		{"hijacks", func(w http.ResponseWriter, _ *http.Request) {
			_, _, err := http.NewResponseController(w).Hijack()
			if assert.Error(t, err) {
				w.WriteHeader(http.StatusAccepted)
			}
		}, http.StatusAccepted, true},
		{"writes 200 after 64 KiB", func(w http.ResponseWriter, _ *http.Request) {
			w.Write(bytes.Repeat([]byte("x"), 100<<10))
		}, http.StatusOK, true},
		{"streams a 500", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write(bytes.Repeat([]byte("x"), 100<<10))
		}, http.StatusInternalServerError, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			url := serve(t, newReceiver(t, teststores.Memory(t)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				c.h(w, r)
			}))
			a := deliver(t, url, "msg_h", payload)
			assert.Equal(t, c.status, a.status)
			assert.False(t, a.replayed)
			b := deliver(t, url, "msg_h", payload)
			assert.Equal(t, c.status, b.status)
			assert.Equal(t, c.kept, b.replayed)
			want := int32(2)
			if c.kept {
				want = 1
			}
			assert.Equal(t, want, runs.Load())
		})
	}
}

// TestAttackHandlerAnswersAfterSenderLeft: a handler that answers 2xx after
// its sender went away is kept: its effect happened, and the retry gets
// the 2xx without running it again. One that gives up without an answer
// is released, and the retry runs it.
func TestAttackHandlerAnswersAfterSenderLeft(t *testing.T) {
	for _, answers := range []bool{true, false} {
		t.Run(strconv.FormatBool(answers), func(t *testing.T) {
			ev := newEvents()
			var runs atomic.Int32
			entered := make(chan struct{}, 2)
			url := serve(t, newReceiver(t, teststores.Memory(t), webhook.WithConfig(engine.Config{Observer: ev.observe})),
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) > 1 {
						w.WriteHeader(http.StatusNoContent)
						return
					}
					entered <- struct{}{}
					<-r.Context().Done()
					if answers {
						w.WriteHeader(http.StatusAccepted)
					}
				}))
			ctx, cancel := context.WithCancel(context.Background())
			gone := make(chan error, 1)
			go func() {
				_, err := http.DefaultClient.Do(standardRequest(t, url, "msg_left", payload).WithContext(ctx))
				gone <- err
			}()
			<-entered
			cancel()
			assert.Error(t, <-gone)
			if answers {
				ev.next(t, engine.EventExecuted)
				a := deliver(t, url, "msg_left", payload)
				assert.Equal(t, http.StatusAccepted, a.status)
				assert.True(t, a.replayed)
				assert.Equal(t, int32(1), runs.Load())
				return
			}
			ev.next(t, engine.EventReleased)
			a := deliver(t, url, "msg_left", payload)
			assert.Equal(t, http.StatusNoContent, a.status)
			assert.False(t, a.replayed)
			assert.Equal(t, int32(2), runs.Load())
		})
	}
}

// countingHandler counts the log records of one message.
type countingHandler struct {
	msg string
	n   *atomic.Int32
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestAttackKeepPanics: a WithKeep that panics leaves the default to
// decide: a 2xx is kept, a 500 released; the panic is logged once.
func TestAttackKeepPanics(t *testing.T) {
	var logged atomic.Int32
	logger := slog.New(countingHandler{msg: "keep function panicked", n: &logged})
	var runs atomic.Int32
	status := atomic.Int32{}
	status.Store(http.StatusInternalServerError)
	url := serve(t, newReceiver(t, teststores.Memory(t),
		webhook.WithKeep(func(int) bool { panic("keep") }),
		webhook.WithConfig(engine.Config{Logger: logger})),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(int(status.Load()))
		}))
	assert.Equal(t, http.StatusInternalServerError, deliver(t, url, "msg_kp", payload).status)
	status.Store(http.StatusOK)
	assert.Equal(t, http.StatusOK, deliver(t, url, "msg_kp", payload).status)
	again := deliver(t, url, "msg_kp", payload)
	assert.True(t, again.replayed)
	assert.Equal(t, int32(2), runs.Load())
	assert.Equal(t, int32(1), logged.Load())
}

// TestAttackTimeoutHandler: a Receiver inside http.TimeoutHandler whose
// handler outlasts the timeout: the sender gets the TimeoutHandler's 503;
// the handler's late 2xx is kept, and the retry gets it without a rerun.
func TestAttackTimeoutHandler(t *testing.T) {
	rc := newReceiver(t, teststores.Memory(t))
	var runs atomic.Int32
	done := make(chan struct{})
	h := http.TimeoutHandler(rc.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-r.Context().Done()
		w.WriteHeader(http.StatusOK)
		go func() { done <- struct{}{} }()
	})), 50*time.Millisecond, "slow")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	a := deliver(t, srv.URL, "msg_to", payload)
	assert.Equal(t, http.StatusServiceUnavailable, a.status)
	<-done
	require.Eventually(t, func() bool {
		a := deliver(t, srv.URL, "msg_to", payload)
		return a.status == http.StatusOK && a.replayed
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, int32(1), runs.Load())
}

// loggingWriter is a ResponseWriter wrapper that hides everything but the
// three methods, as many logging middlewares do.
type loggingWriter struct {
	w      http.ResponseWriter
	status int
}

func (l *loggingWriter) Header() http.Header         { return l.w.Header() }
func (l *loggingWriter) Write(p []byte) (int, error) { return l.w.Write(p) }
func (l *loggingWriter) WriteHeader(code int) {
	l.status = code
	l.w.WriteHeader(code)
}

// TestAttackLoggingWrapper: behind a wrapper that hides Flush, the door
// answers as it does without one, and the wrapper sees the status.
func TestAttackLoggingWrapper(t *testing.T) {
	rc := newReceiver(t, teststores.Memory(t))
	var e effects
	inner := rc.Handler(counting(&e))
	statuses := make(chan int, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lw := &loggingWriter{w: w}
		inner.ServeHTTP(lw, r)
		statuses <- lw.status
	}))
	t.Cleanup(srv.Close)
	a := deliver(t, srv.URL, "msg_log", payload)
	assert.Equal(t, http.StatusOK, a.status)
	assert.Equal(t, http.StatusOK, <-statuses)
	b := deliver(t, srv.URL, "msg_log", payload)
	assert.True(t, b.replayed)
	assert.Equal(t, http.StatusOK, <-statuses)
	assert.Equal(t, 1, e.of("msg_log"))
}

// TestAttackHeaders: headers in odd case, doubled, huge or empty are
// answered without a store call unless the delivery is genuine.
func TestAttackHeaders(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	var e effects
	rc := newReceiver(t, store)
	h := rc.Handler(counting(&e))
	url := serve(t, rc, counting(&e))

	// Odd case on the wire: canonicalised by net/http.
	req := standardRequest(t, url, "msg_case", payload)
	for k, v := range req.Header {
		delete(req.Header, k)
		req.Header[strings.ToUpper(k)] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// A second webhook-id after the signed one is ignored; before it, the
	// delivery is not verified.
	req = standardRequest(t, url, "msg_two_ids", payload)
	req.Header.Add("Webhook-Id", "msg_other")
	assert.Equal(t, http.StatusOK, serveDirect(h, req).Code)
	assert.Equal(t, 1, e.of("msg_two_ids"))
	assert.Equal(t, 0, e.of("msg_other"))
	req = standardRequest(t, url, "msg_two_ids_b", payload)
	req.Header["Webhook-Id"] = []string{"msg_other", "msg_two_ids_b"}
	assert.Equal(t, http.StatusUnauthorized, serveDirect(h, req).Code)

	claims := store.Calls(faultstore.Claim)
	huge := strings.Repeat("v1,AAAA ", 1<<17) // 1 MiB
	for name, mod := range map[string]func(*http.Request){
		"huge signature":  func(r *http.Request) { r.Header.Set("Webhook-Signature", huge) },
		"huge id":         func(r *http.Request) { r.Header.Set("Webhook-Id", strings.Repeat("m", 1<<20)) },
		"huge timestamp":  func(r *http.Request) { r.Header.Set("Webhook-Timestamp", strings.Repeat("1", 1<<20)) },
		"empty signature": func(r *http.Request) { r.Header.Set("Webhook-Signature", "") },
		"empty id":        func(r *http.Request) { r.Header.Set("Webhook-Id", "") },
		"empty timestamp": func(r *http.Request) { r.Header.Set("Webhook-Timestamp", "") },
		"two signatures, the good one second": func(r *http.Request) {
			r.Header["Webhook-Signature"] = []string{"v1,AAAA", r.Header.Get("Webhook-Signature")}
		},
	} {
		w := serveDirect(h, func() *http.Request { r := standardRequest(t, url, "msg_bad", payload); mod(r); return r }())
		assert.Contains(t, []int{http.StatusBadRequest, http.StatusUnauthorized}, w.Code, name)
	}
	assert.Equal(t, claims, store.Calls(faultstore.Claim))
}

// TestAttackOtherPresetsDoubledHeaders: a doubled delivery id header is
// refused as malformed; a doubled signature is read as the sender's
// library reads it, the first one.
func TestAttackOtherPresetsDoubledHeaders(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	mac := func(secret string) []byte {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(payload)
		return m.Sum(nil)
	}
	gh, err := webhook.New(store, webhook.GitHub("gh-secret"))
	require.NoError(t, err)
	var e effects
	h := gh.Handler(counting(&e))
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(payload))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hexString(mac("gh-secret")))
	req.Header["X-Github-Delivery"] = []string{"a", "b"}
	assert.Equal(t, http.StatusBadRequest, serveDirect(h, req).Code)

	st, err := webhook.New(store, webhook.Stripe(stripeSecret))
	require.NoError(t, err)
	h = st.Handler(counting(&e))
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, []byte(stripeSecret))
	m.Write([]byte(ts + "."))
	m.Write(payload)
	good := "t=" + ts + ",v1=" + hexString(m.Sum(nil))
	req = httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(payload))
	req.Header["Stripe-Signature"] = []string{"t=" + ts + ",v1=00", good}
	assert.Equal(t, http.StatusUnauthorized, serveDirect(h, req).Code)
	req = httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(payload))
	req.Header["Stripe-Signature"] = []string{good, "t=" + ts + ",v1=00"}
	assert.Equal(t, http.StatusOK, serveDirect(h, req).Code)
	assert.Equal(t, 1, store.Calls(faultstore.Claim))
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestAttackDeliveryIDs: an id over the limit or with a control character
// is refused before the store; the longest one, and one that is not UTF-8,
// are keyed.
func TestAttackDeliveryIDs(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	var e effects
	h := newReceiver(t, store).Handler(counting(&e))
	for id, want := range map[string]int{
		strings.Repeat("i", 255): http.StatusOK,
		strings.Repeat("i", 256): http.StatusBadRequest,
		"msg\x00nul":             http.StatusBadRequest,
		"msg\nline":              http.StatusBadRequest,
		"msg\x7fdel":             http.StatusBadRequest,
		"msg\xff\xfe":            http.StatusOK,
	} {
		w := serveDirect(h, standardRequest(t, "http://hooks.test/", id, payload))
		assert.Equal(t, want, w.Code, "%q", id)
		assert.Equal(t, want/100 == 2, e.of(id) == 1, "%q", id)
	}
	assert.Equal(t, 2, store.Calls(faultstore.Claim))
}

// TestAttackTimestamps: a timestamp far in the future or past, negative,
// signed with a sign, or not a number, is refused before the store.
func TestAttackTimestamps(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	var e effects
	h := newReceiver(t, store).Handler(counting(&e))
	now := time.Now().Unix()
	for ts, want := range map[string]int{
		strconv.FormatInt(now+3600, 10):   http.StatusUnauthorized,
		strconv.FormatInt(now-3600, 10):   http.StatusUnauthorized,
		"9223372036854775807":             http.StatusUnauthorized,
		"9223372036854775808":             http.StatusBadRequest,
		"-9223372036854775808":            http.StatusUnauthorized,
		"-1":                              http.StatusUnauthorized,
		"0":                               http.StatusUnauthorized,
		"soon":                            http.StatusBadRequest,
		" " + strconv.FormatInt(now, 10):  http.StatusBadRequest,
		strconv.FormatInt(now, 10) + ".5": http.StatusBadRequest,
	} {
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(payload))
		req.Header.Set("Webhook-Id", "msg_ts")
		req.Header.Set("Webhook-Timestamp", ts)
		req.Header.Set("Webhook-Signature", signStandard(t, "msg_ts", ts, payload))
		assert.Equal(t, want, serveDirect(h, req).Code, "%q", ts)
	}
	assert.Zero(t, store.Calls(faultstore.Claim))
	assert.Equal(t, 0, e.of("msg_ts"))
}

// TestAttackSecrets: empty, malformed and prefix-only secrets are refused
// by New; a secret given twice works.
func TestAttackSecrets(t *testing.T) {
	store := teststores.Memory(t)
	for _, s := range []webhook.Sender{
		webhook.StandardWebhooks(""), webhook.StandardWebhooks("whsec_"), webhook.StandardWebhooks("whsec_not base64!"),
		webhook.StandardWebhooks(standardSecret, "whsec_%%%"),
		webhook.Stripe(""), webhook.Stripe(stripeSecret, ""), webhook.GitHub(), webhook.Shopify(""), webhook.GitLab(""),
	} {
		_, err := webhook.New(store, s)
		assert.Error(t, err, s.Name)
		if err != nil {
			assert.NotContains(t, err.Error(), strings.TrimPrefix(standardSecret, "whsec_"))
		}
	}
	var e effects
	rc, err := webhook.New(store, webhook.StandardWebhooks(standardSecret, standardSecret))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, serveDirect(rc.Handler(counting(&e)), standardRequest(t, "http://hooks.test/", "msg_dup_secret", payload)).Code)
}

// TestAttackBodies: a body shorter than its Content-Length, a sender that
// leaves mid-body, and one that stalls then leaves: refused, nothing
// claimed.
func TestAttackBodies(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	ev := newEvents()
	var e effects
	rc := newReceiver(t, store, webhook.WithConfig(engine.Config{Observer: ev.observe}))
	url := serve(t, rc, counting(&e))

	pr, pw := io.Pipe()
	req := standardRequest(t, url, "msg_stall", payload)
	req.Body = pr
	req.ContentLength = int64(len(payload))
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := http.DefaultClient.Do(req.WithContext(ctx))
		gone <- err
	}()
	_, err := pw.Write(payload[:10])
	require.NoError(t, err)
	cancel()
	pw.CloseWithError(errors.New("the sender went away"))
	assert.Error(t, <-gone)
	rej := ev.next(t, engine.EventRejected)
	assert.Equal(t, http.StatusBadRequest, rej.Status)
	assert.Zero(t, store.Calls(faultstore.Claim))
	assert.Equal(t, 0, e.of("msg_stall"))
}

// TestAttackShutdownInFlight: Shutdown while a delivery runs returns, the
// delivery is answered, and its record stored.
func TestAttackShutdownInFlight(t *testing.T) {
	rc := newReceiver(t, teststores.Memory(t))
	var e effects
	entered, release := make(chan struct{}, 1), make(chan struct{})
	url := serve(t, rc, blocked(&e, entered, release))
	first := make(chan answer, 1)
	go func() { first <- deliver(t, url, "msg_sd", payload) }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, rc.Shutdown(ctx))
	close(release)
	assert.Equal(t, http.StatusAccepted, (<-first).status)
	again := deliver(t, url, "msg_sd", payload)
	assert.Equal(t, http.StatusAccepted, again.status)
	assert.True(t, again.replayed)
	assert.Equal(t, 1, e.of("msg_sd"))
}

// TestAttackHandlerOutlastsItsLease: a handler that answers a 2xx after
// several lease renewals is kept, and runs once.
func TestAttackHandlerOutlastsItsLease(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	var runs atomic.Int32
	url := serve(t, newReceiver(t, store, webhook.WithConfig(engine.Config{Lease: 50 * time.Millisecond})),
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			for store.Calls(faultstore.Extend) < 3 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
			w.WriteHeader(http.StatusAccepted)
		}))
	assert.Equal(t, http.StatusAccepted, deliver(t, url, "msg_long", payload).status)
	again := deliver(t, url, "msg_long", payload)
	assert.Equal(t, http.StatusAccepted, again.status)
	assert.True(t, again.replayed)
	assert.Equal(t, int32(1), runs.Load())
}

// TestAttackUnsignedDeliveryIDs: GitHub and Shopify sign the body only, not
// the delivery id: a captured delivery resent at once under another id is
// verified and runs again, as their presets' documentation says. Standard
// Webhooks signs its id: the same resend is refused.
func TestAttackUnsignedDeliveryIDs(t *testing.T) {
	mac := func(secret string) []byte {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(payload)
		return m.Sum(nil)
	}
	for _, c := range []struct {
		sender   webhook.Sender
		idHeader string
		sign     func(h http.Header)
	}{
		{webhook.GitHub("gh-secret"), "X-GitHub-Delivery", func(h http.Header) { h.Set("X-Hub-Signature-256", "sha256="+hexString(mac("gh-secret"))) }},
		{webhook.Shopify("shop-secret"), "X-Shopify-Event-Id", func(h http.Header) {
			h.Set("X-Shopify-Hmac-Sha256", base64.StdEncoding.EncodeToString(mac("shop-secret")))
		}},
	} {
		rc, err := webhook.New(teststores.Memory(t), c.sender)
		require.NoError(t, err)
		var runs atomic.Int32
		h := rc.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs.Add(1) }))
		for _, id := range []string{"captured", "captured", "resent-under-another-id"} {
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(payload))
			c.sign(req.Header)
			req.Header.Set(c.idHeader, id)
			assert.Equal(t, http.StatusOK, serveDirect(h, req).Code, c.sender.Name)
		}
		assert.Equal(t, int32(2), runs.Load(), c.sender.Name)
	}
	var e effects
	h := newReceiver(t, teststores.Memory(t)).Handler(counting(&e))
	req := standardRequest(t, "http://hooks.test/", "msg_captured", payload)
	req.Header.Set("Webhook-Id", "msg_resent")
	assert.Equal(t, http.StatusUnauthorized, serveDirect(h, req).Code)
}
