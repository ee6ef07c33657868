package faultrun

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/server"
)

// HistoryConfig describes a recorded history. The zero values are replaced
// by the defaults documented on each field.
type HistoryConfig struct {
	// Clients is the number of concurrent clients (default 8), each an
	// idempotency.Client of its own.
	Clients int
	// Rounds is the number of rounds (default 20). In each round the
	// clients start together and make Calls calls each (default 3), each
	// on one of Keys keys (default 3) that only this round uses, chosen at
	// random, with the other body (variant "b") at the rate OtherBody
	// (default 0.15).
	Rounds, Calls, Keys int
	OtherBody           float64

	// Seed seeds the clients' choices and the network's faults.
	Seed uint64
	// Drop, Reset and Delay are the network's fault rates, as in Config.
	Drop, Reset, Delay float64
	// AttemptTimeout is the clients' (default 300ms); a delayed response
	// is held twice as long.
	AttemptTimeout time.Duration
	// Work is how long each execution of the API takes (default 2ms), so
	// that the clients' requests overlap.
	Work time.Duration

	// ClientOptions come after the history's own; ServerOptions are the
	// middleware's.
	ClientOptions []idempotency.Option
	ServerOptions []server.Option
}

func (c HistoryConfig) withDefaults() HistoryConfig {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Clients, 8)
	def(&c.Rounds, 20)
	def(&c.Calls, 3)
	def(&c.Keys, 3)
	if c.OtherBody <= 0 {
		c.OtherBody = 0.15
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = 300 * time.Millisecond
	}
	if c.Work <= 0 {
		c.Work = 2 * time.Millisecond
	}
	return c
}

// History is every attempt of a recorded run, with what the API did.
type History struct {
	// Operations has one operation per attempt, with a Call as input and a
	// Result as output, timed by the client: from the moment the attempt
	// was sent to the moment its whole answer was read. An attempt without
	// an answer has the largest return time of all, since its request may
	// still take effect at any point after it was sent.
	Operations []porcupine.Operation
	// Executions holds the order numbers the API made, by key.
	Executions map[string][]int
	// Network is what the proxy between the clients and the API did.
	Network faultnet.Stats
}

// historyLog is the RoundTripper under the clients: it records each
// attempt as an operation.
type historyLog struct {
	base  http.RoundTripper
	start time.Time

	mu  sync.Mutex
	ops []porcupine.Operation
}

type clientIDKey struct{}

func (l *historyLog) RoundTrip(req *http.Request) (*http.Response, error) {
	in := Call{Key: req.Header.Get("Idempotency-Key"), Variant: req.Header.Get("X-Variant")}
	client, _ := req.Context().Value(clientIDKey{}).(int)
	called := int64(time.Since(l.start))
	resp, err := l.base.RoundTrip(req)
	out := Result{Kind: Unknown}
	if err == nil {
		var body []byte
		body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err == nil {
			resp.Body = io.NopCloser(bytes.NewReader(body))
			out = result(resp, body)
		} else {
			resp = nil
		}
	}
	returned := int64(time.Since(l.start))
	if out.Kind == Unknown {
		returned = math.MaxInt64 // fixed when the history ends
	}
	l.mu.Lock()
	l.ops = append(l.ops, porcupine.Operation{ClientId: client, Input: in, Call: called, Output: out, Return: returned})
	l.mu.Unlock()
	return resp, err
}

// result reads what an answer says.
func result(resp *http.Response, body []byte) Result {
	switch resp.StatusCode {
	case http.StatusCreated:
		var o struct{ ID int }
		if json.Unmarshal(body, &o) != nil || o.ID <= 0 {
			return Result{Kind: Unexpected, Status: resp.StatusCode}
		}
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			return Result{Kind: Replayed, ID: o.ID}
		}
		return Result{Kind: Created, ID: o.ID}
	case http.StatusConflict:
		return Result{Kind: Conflict}
	case http.StatusUnprocessableEntity:
		return Result{Kind: Mismatch}
	case http.StatusServiceUnavailable:
		return Result{Kind: Unavailable}
	case http.StatusBadGateway:
		return Result{Kind: Unknown} // the proxy's: the API may have run
	}
	return Result{Kind: Unexpected, Status: resp.StatusCode}
}

// RecordHistory runs concurrent clients over a few shared keys through a
// lossy proxy in front of the Orders API behind the middleware on store, and
// records every attempt. Check the history with porcupine and Model, and
// with History.Problems.
func RecordHistory(ctx context.Context, store engine.Store, cfg HistoryConfig) (*History, error) {
	cfg = cfg.withDefaults()
	api := NewOrders()
	api.Work = cfg.Work
	mw, err := server.New(store, cfg.ServerOptions...)
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	srv, err := serve(mw.Handler(api))
	if err != nil {
		return nil, err
	}
	defer srv.close()
	sched := newSchedule(cfg.Seed, cfg.Drop, cfg.Reset, cfg.Delay)
	proxy, err := faultnet.Start(srv.url, faultnet.Config{Decide: sched.decide, Delay: 2 * cfg.AttemptTimeout})
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	defer proxy.Close()
	// A connection per attempt: net/http resends a keyed request on its
	// own when a reused connection fails, and that hidden attempt would
	// escape the record.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	log := &historyLog{base: tr, start: time.Now()}
	url := proxy.URL() + "/orders"

	for round := range cfg.Rounds {
		// Fresh clients each round, each with a budget of its own.
		roundClients := make([]*idempotency.Client, cfg.Clients)
		for c := range roundClients {
			if roundClients[c], err = idempotency.NewClient(append([]idempotency.Option{
				idempotency.WithHTTPClient(&http.Client{Transport: log}),
				idempotency.WithAttemptTimeout(cfg.AttemptTimeout),
			}, cfg.ClientOptions...)...); err != nil {
				return nil, fmt.Errorf("faultrun: %w", err)
			}
		}
		var clients sync.WaitGroup
		for c := range cfg.Clients {
			clients.Go(func() {
				rng := rand.New(rand.NewPCG(cfg.Seed, uint64(round)<<32|uint64(c)))
				client := roundClients[c]
				cctx := context.WithValue(ctx, clientIDKey{}, c)
				for range cfg.Calls {
					key := fmt.Sprintf("r%03d-k%d", round, rng.IntN(cfg.Keys))
					variant := "a"
					if rng.Float64() < cfg.OtherBody {
						variant = "b"
					}
					req, err := http.NewRequestWithContext(cctx, http.MethodPost, url,
						bytes.NewReader([]byte(`{"ref":"`+key+`","note":"`+variant+`"}`)))
					if err != nil {
						return
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", key)
					req.Header.Set("X-Variant", variant)
					resp, err := client.Do(req)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			})
		}
		clients.Wait()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}

	h := &History{Operations: log.ops, Executions: map[string][]int{}, Network: proxy.Stats()}
	var last int64
	for _, op := range h.Operations {
		if op.Return != math.MaxInt64 {
			last = max(last, op.Return)
		}
	}
	for i := range h.Operations {
		if h.Operations[i].Return == math.MaxInt64 {
			h.Operations[i].Return = last + 1
		}
		k := h.Operations[i].Input.(Call).Key
		if _, ok := h.Executions[k]; !ok {
			h.Executions[k] = api.Executions(k)
		}
	}
	return h, nil
}

// Answers counts the operations by what they came to.
func (h *History) Answers() map[Kind]int {
	m := map[Kind]int{}
	for _, op := range h.Operations {
		m[op.Output.(Result).Kind]++
	}
	return m
}

// Problems returns what the history shows against the API's own record,
// beyond what Model checks: a key whose order was made more than once, an
// answer that names an order the API did not make for that key, and answers
// the protocol never gives.
func (h *History) Problems() []string {
	var p []string
	keys := make([]string, 0, len(h.Executions))
	for k, ids := range h.Executions {
		keys = append(keys, k)
		if len(ids) > 1 {
			p = append(p, fmt.Sprintf("key %s: order made %d times: %v", k, len(ids), ids))
		}
	}
	slices.Sort(keys)
	for _, op := range h.Operations {
		in, out := op.Input.(Call), op.Output.(Result)
		switch out.Kind {
		case Created, Replayed:
			if ids := h.Executions[in.Key]; len(ids) != 1 || ids[0] != out.ID {
				p = append(p, fmt.Sprintf("key %s: answered with order %d, the API made %v", in.Key, out.ID, ids))
			}
		case Unexpected:
			p = append(p, fmt.Sprintf("key %s: answered %d", in.Key, out.Status))
		}
	}
	return p
}

// explainLimit bounds the time Explain spends checking the keys: the check
// of one key's history can take exponential time (it did, for minutes,
// behind a store that forgets, on a loaded machine), and Explain only
// illustrates a failure that a check has already found.
const explainLimit = 10 * time.Second

// Explain returns the operations, in the order they were sent, of up to
// three keys whose history Model finds not linearizable, or "" if it finds
// none: what a failing check shows without its visualization. It checks
// the keys for 10 seconds at most; when it shows a key, it also says how
// many it left unchecked.
func (h *History) Explain() string {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range h.Operations {
		k := op.Input.(Call).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	slices.Sort(keys)
	m := Model()
	var b bytes.Buffer
	shown, unchecked := 0, 0
	deadline := time.Now().Add(explainLimit)
	for _, k := range keys {
		ops := byKey[k]
		if shown == 3 {
			break
		}
		left := time.Until(deadline)
		if left <= 0 {
			unchecked++
			continue
		}
		switch porcupine.CheckOperationsTimeout(m, ops, left) {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			unchecked++
			continue
		}
		shown++
		slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		fmt.Fprintf(&b, "key %s, orders made by the API %v:\n", k, h.Executions[k])
		for _, op := range ops {
			fmt.Fprintf(&b, "  client %d, sent %v, answered %v: %s\n", op.ClientId,
				time.Duration(op.Call).Round(time.Microsecond), time.Duration(op.Return).Round(time.Microsecond),
				m.DescribeOperation(op.Input, op.Output))
		}
	}
	if unchecked > 0 && b.Len() > 0 {
		fmt.Fprintf(&b, "(%d keys not checked to the end within %v)\n", unchecked, explainLimit)
	}
	return b.String()
}
