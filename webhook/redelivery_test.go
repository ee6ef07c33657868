package webhook_test

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
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
	stripewebhook "github.com/stripe/stripe-go/v82/webhook"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/webhook"
)

var (
	redeliveryLong   = flag.Bool("webhook.long", false, "run TestRedelivery at full size: 2,000 events per sender, store and mode")
	redeliveryEvents = flag.Int("webhook.events", 0, "events per sender, store and mode in TestRedelivery (0: 40, or 2,000 with -webhook.long)")
	redeliverySeed   = flag.Uint64("webhook.seed", 1, "seed of TestRedelivery's network faults and handler failures")
)

// signer signs one attempt of a delivery as a sender does: afresh, with
// the time of the attempt.
type signer struct {
	name   string
	sender func() webhook.Sender
	body   func(id string) []byte
	sign   func(r *http.Request, id string, body []byte) error
}

var signers = []signer{
	{
		name:   "standard-webhooks",
		sender: func() webhook.Sender { return webhook.StandardWebhooks(standardSecret) },
		body:   func(id string) []byte { return []byte(`{"type":"invoice.paid","data":{"invoice":"` + id + `"}}`) },
		sign: func(r *http.Request, id string, body []byte) error {
			wh, err := standardwebhooks.NewWebhook(standardSecret)
			if err != nil {
				return err
			}
			now := time.Now()
			sig, err := wh.Sign(id, now, body)
			r.Header.Set("webhook-id", id)
			r.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
			r.Header.Set("webhook-signature", sig)
			return err
		},
	},
	{
		name:   "stripe",
		sender: func() webhook.Sender { return webhook.Stripe(stripeSecret) },
		body: func(id string) []byte {
			return []byte(`{"id":"` + id + `","object":"event","type":"payment_intent.succeeded"}`)
		},
		sign: func(r *http.Request, _ string, body []byte) error {
			p := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: body, Secret: stripeSecret})
			r.Header.Set("Stripe-Signature", p.Header)
			return nil
		},
	},
}

// ranKey marks, in a request's context, whether the effect ran in it.
type ranKey struct{}

// tally is what one redelivery run counts on the receiving side.
type tally struct {
	mu        sync.Mutex
	effects   map[string]int
	firstRuns map[string]bool // ids whose handler has failed once already

	answered     atomic.Int64 // answers written by the receiver
	ran          atomic.Int64 // answers whose request ran the effect handler
	duplicates   atomic.Int64 // answers to requests that did not run it
	dupNon2xx    atomic.Int64 // of which not 2xx
	dupStatus409 atomic.Int64 // of which 409
	failed       atomic.Int64 // handler failures (5xx before the effect)
}

// effect is the receiver's work: it fails before its effect on the first
// run of one event in ten (a dependency down), and takes a few
// milliseconds, so that redeliveries arrive while it runs.
func (tl *tally) effect(seed uint64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Context().Value(ranKey{}).(*atomic.Bool).Store(true)
		id := r.Header.Get("X-Test-Event")
		h := fnv.New64a()
		io.WriteString(h, id)
		x := h.Sum64() ^ seed
		tl.mu.Lock()
		fail := x%10 == 0 && !tl.firstRuns[id]
		tl.firstRuns[id] = true
		tl.mu.Unlock()
		work := time.NewTimer(time.Duration(x%20) * time.Millisecond)
		select {
		case <-work.C:
		case <-r.Context().Done():
			work.Stop()
			return
		}
		if fail {
			tl.failed.Add(1)
			http.Error(w, "ledger unavailable", http.StatusInternalServerError)
			return
		}
		tl.mu.Lock()
		tl.effects[id]++
		tl.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
}

// statusWriter records the status of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// record counts every answer of h: whether the effect handler ran in its
// request, and its status.
func (tl *tally) record(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran := new(atomic.Bool)
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), ranKey{}, ran)))
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		tl.answered.Add(1)
		if ran.Load() {
			tl.ran.Add(1)
			return
		}
		tl.duplicates.Add(1)
		if status < 200 || status > 299 {
			tl.dupNon2xx.Add(1)
		}
		if status == http.StatusConflict {
			tl.dupStatus409.Add(1)
		}
	})
}

// runResult is one redelivery run's figures.
type runResult struct {
	events, delivered, attempts                 int64
	dropped, reset, delayed                     int64
	effects, eventsTwice, extraEffects          int64
	answered, duplicates, dupNon2xx, dup409, fx int64
}

// redeliver runs one sender's delivery of n events through a lossy proxy to
// h: each event is sent, and sent again (signed afresh, same id) until it
// gets a 2xx, after a back-off that doubles from 5 ms (the shape of the
// senders' schedules, compressed), at most 12 times; one event in ten is
// also delivered twice at once, as a sender's duplicate; the proxy drops
// one answer in ten after the receiver wrote it (a lost ack), resets one
// connection in twenty before it, and holds one answer in twenty past the
// sender's timeout.
func redeliver(t *testing.T, sg signer, n int, seed uint64, h http.Handler) (*faultnet.Proxy, int64, int64) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	proxy, err := faultnet.Start(srv.URL, faultnet.Config{DropRate: 0.10, ResetRate: 0.05, DelayRate: 0.05, Delay: 300 * time.Millisecond, Seed: seed})
	require.NoError(t, err)
	defer proxy.Close()
	client := &http.Client{Timeout: 150 * time.Millisecond, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections()

	attempt := func(id string, body []byte) bool {
		req, err := http.NewRequest(http.MethodPost, proxy.URL()+"/hooks", strings.NewReader(string(body)))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Test-Event", id)
			err = sg.sign(req, id, body)
		}
		if err != nil {
			t.Errorf("sign %s: %v", id, err)
			return false
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 300
	}
	var delivered, attempts atomic.Int64
	rng := rand.New(rand.NewPCG(seed, 31))
	twice := make([]bool, n)
	for i := range twice {
		twice[i] = rng.IntN(10) == 0
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				id := fmt.Sprintf("evt_%s_%d", sg.name, i)
				body := sg.body(id)
				ok := false
				if twice[i] {
					var other atomic.Bool
					var dup sync.WaitGroup
					dup.Go(func() { other.Store(attempt(id, body)) })
					ok = attempt(id, body)
					dup.Wait()
					attempts.Add(2)
					ok = ok || other.Load()
				} else {
					ok = attempt(id, body)
					attempts.Add(1)
				}
				backoff := 5 * time.Millisecond
				for try := 1; !ok && try < 12; try++ {
					timer := time.NewTimer(backoff)
					<-timer.C
					backoff *= 2
					ok = attempt(id, body)
					attempts.Add(1)
				}
				if ok {
					delivered.Add(1)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return proxy, delivered.Load(), attempts.Load()
}

// TestRedelivery delivers events the way senders do, through a network that
// loses acknowledgements, resets connections and delays answers past the
// sender's timeout, with concurrent redeliveries and handlers that fail
// once: with the door, on every store, every event takes effect once and no
// duplicate gets a non-2xx answer; without it, effects repeat. Run it at
// full size with -webhook.long.
func TestRedelivery(t *testing.T) {
	n := 40
	if *redeliveryLong {
		n = 2000
	}
	if *redeliveryEvents > 0 {
		n = *redeliveryEvents
	}
	for _, sg := range signers {
		for _, kind := range teststores.All() {
			for _, door := range []bool{true, false} {
				name := sg.name + "/" + kind.Name + "/door"
				if !door {
					name = sg.name + "/" + kind.Name + "/no-door"
				}
				t.Run(name, func(t *testing.T) {
					tl := &tally{effects: map[string]int{}, firstRuns: map[string]bool{}}
					var h http.Handler = tl.effect(*redeliverySeed)
					if door {
						rc, err := webhook.New(kind.New(t), sg.sender())
						require.NoError(t, err)
						defer func() {
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
							defer cancel()
							assert.NoError(t, rc.Shutdown(ctx))
						}()
						h = rc.Handler(h)
					}
					proxy, delivered, attempts := redeliver(t, sg, n, *redeliverySeed, tl.record(h))
					st := proxy.Stats()
					res := runResult{events: int64(n), delivered: delivered, attempts: attempts,
						dropped: st.Dropped, reset: st.Reset, delayed: st.Delayed,
						answered: tl.answered.Load(), duplicates: tl.duplicates.Load(), dupNon2xx: tl.dupNon2xx.Load(), dup409: tl.dupStatus409.Load(), fx: tl.failed.Load()}
					tl.mu.Lock()
					for _, c := range tl.effects {
						res.effects += int64(c)
						if c > 1 {
							res.eventsTwice++
							res.extraEffects += int64(c - 1)
						}
					}
					distinct := len(tl.effects)
					tl.mu.Unlock()
					t.Logf("%s: %d events, %d delivered in %d attempts (proxy: %d acks dropped, %d reset, %d delayed past the timeout); "+
						"%d handler failures; %d effects, %d events applied more than once (%d extra); "+
						"%d answers, %d to duplicates, %d of them not 2xx, %d of them 409",
						name, res.events, res.delivered, res.attempts, res.dropped, res.reset, res.delayed,
						res.fx, res.effects, res.eventsTwice, res.extraEffects,
						res.answered, res.duplicates, res.dupNon2xx, res.dup409)
					assert.Equal(t, int64(n), delivered, "events the sender gave up on")
					assert.Equal(t, n, distinct, "events without an effect")
					assert.Positive(t, res.dropped+res.delayed, "the network lost no answer: the run tests nothing")
					if door {
						assert.Equal(t, int64(n), res.effects, "effects")
						assert.Zero(t, res.eventsTwice, "events applied more than once")
						assert.Positive(t, res.duplicates, "no duplicate reached the receiver")
						assert.Zero(t, res.dupNon2xx, "duplicates answered with a non-2xx")
					} else {
						assert.Positive(t, res.extraEffects, "without the door, the redeliveries repeated no effect")
					}
					assert.Zero(t, res.dup409, "409 answers")
				})
			}
		}
	}
}
