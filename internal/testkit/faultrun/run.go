package faultrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/server"
)

// Fault names what a Window does.
type Fault int

const (
	// Blackhole holds everything between the client and the API (see
	// faultnet.Proxy.SetBlackhole): requests and responses wait, and go on
	// when the window ends.
	Blackhole Fault = iota + 1
	// StoreCut cuts the link from the API to its store: every store
	// operation fails at once.
	StoreCut
	// StoreSlow slows the link from the API to its store by
	// Window.Latency, which should exceed the store timeout.
	StoreSlow
)

// String returns the fault's name, such as "store cut".
func (f Fault) String() string {
	switch f {
	case Blackhole:
		return "black hole"
	case StoreCut:
		return "store cut"
	case StoreSlow:
		return "store slow"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// Window is a period of a run during which a Fault is on.
type Window struct {
	Fault Fault
	// After is how many orders have been handed to the callers when the
	// window starts (after the window before it has ended).
	After int
	// For is how long the window lasts.
	For time.Duration
	// Latency is what StoreSlow adds to every store operation.
	Latency time.Duration
}

// Config describes a run. The zero values of the optional fields are
// replaced by the defaults documented on each.
type Config struct {
	// Orders is the number of orders to place; Callers place them
	// concurrently (default 16), each order with a key of its own.
	Orders, Callers int

	// Seed seeds every random choice of the network's faults (see
	// faultnet.Config.Decide): the fault given to a request depends on the
	// seed, its key and how many requests with that key came before it.
	Seed uint64

	// Drop, Reset and Delay are the network's fault rates between the
	// client and the API, as in faultnet.Config. A delayed response is held
	// for DelayFor (default twice the attempt timeout).
	Drop, Reset, Delay float64
	DelayFor           time.Duration

	// AttemptTimeout is the client's per-attempt timeout (default 500ms).
	AttemptTimeout time.Duration
	// StoreTimeout is the middleware's (default 5s, as server's).
	StoreTimeout time.Duration

	// Windows are the periods of the run with a fault on, in the order
	// they happen.
	Windows []Window

	// Calls is how many times a caller calls the client for one order while
	// the faults are on, before moving to the next order (default 3); it
	// waits ResumeAfter (default 250ms) between two calls. An order not
	// confirmed by then is resumed after the faults stop, with its key, for
	// at most Settle (default 2 minutes) all orders together.
	Calls       int
	ResumeAfter time.Duration
	Settle      time.Duration

	// Lease is the middleware's lease: the engine's default (1 min) when 0.
	Lease time.Duration

	// ClientOptions come after the run's own (the HTTP client and the
	// attempt timeout); ServerOptions after the engine's configuration
	// (the store timeout, the lease and the run's logger).
	ClientOptions []idempotency.Option
	ServerOptions []server.Option

	// Work is how long each execution of the API takes.
	Work time.Duration
}

func (c Config) withDefaults(link StoreLink) (Config, error) {
	if c.Orders <= 0 {
		return c, fmt.Errorf("faultrun: %d orders", c.Orders)
	}
	if c.Callers <= 0 {
		c.Callers = 16
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = 500 * time.Millisecond
	}
	if c.DelayFor <= 0 {
		c.DelayFor = 2 * c.AttemptTimeout
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 5 * time.Second
	}
	if c.Calls <= 0 {
		c.Calls = 3
	}
	if c.ResumeAfter <= 0 {
		c.ResumeAfter = 250 * time.Millisecond
	}
	if c.Settle <= 0 {
		c.Settle = 2 * time.Minute
	}
	for i, w := range c.Windows {
		switch {
		case w.Fault < Blackhole || w.Fault > StoreSlow:
			return c, fmt.Errorf("faultrun: window %d: unknown fault %d", i, int(w.Fault))
		case w.After < 0 || w.After >= c.Orders:
			return c, fmt.Errorf("faultrun: window %d starts after %d of %d orders", i, w.After, c.Orders)
		case w.For <= 0:
			return c, fmt.Errorf("faultrun: window %d lasts %v", i, w.For)
		case (w.Fault == StoreCut || w.Fault == StoreSlow) && link == nil:
			return c, fmt.Errorf("faultrun: window %d: %v without a StoreLink", i, w.Fault)
		case w.Fault == StoreSlow && w.Latency <= 0:
			return c, fmt.Errorf("faultrun: window %d: store slow by %v", i, w.Latency)
		}
	}
	return c, nil
}

// order is one order's life, as its caller sees it.
type order struct {
	ref, key, body string

	calls, attempts  int
	first, confirmed time.Time
	id               int
	phase            int // 0: not confirmed; 1: while the faults were on; 2: after
}

// runner is one Run in progress.
type runner struct {
	cfg    Config
	link   StoreLink
	url    string
	client *idempotency.Client
	// auditClient is client without a retry budget, for the audit.
	auditClient *idempotency.Client
	proxy       *faultnet.Proxy
	sched       *schedule
	log         *serverLog
	orders      []*order

	mu      sync.Mutex
	windows []WindowReport
}

// Run places cfg.Orders orders through a faultnet proxy in front of the
// Orders API behind the middleware on store, with an idempotency.Client,
// while the network loses, resets and delays requests and the windows cut
// or slow the way to the store (through link, which may be nil if no window
// needs it). Each order has a key of its own, which its caller keeps: a
// caller whose call fails resumes the order with the same key, as a real
// caller that stored the key with the operation would.
//
// The run has three phases. While the faults are on, each order gets
// cfg.Calls calls. Then every fault stops, and the orders not yet confirmed
// are resumed until they are (within cfg.Settle). Last, every order is sent
// once more, and must be answered with a replay of the response its caller
// got. The report says what came of it; an error means the run could not
// be made, not that it found a problem (see Report.Problems).
func Run(ctx context.Context, store engine.Store, link StoreLink, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults(link)
	if err != nil {
		return nil, err
	}
	api := NewOrders()
	api.Work = cfg.Work
	log := &serverLog{}
	logged := newLogCounter()
	mw, err := server.New(store, append([]server.Option{
		server.WithConfig(engine.Config{StoreTimeout: cfg.StoreTimeout, Lease: cfg.Lease, Logger: slog.New(logged)}),
	}, cfg.ServerOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	srv, err := serve(log.wrap(mw.Handler(api)))
	if err != nil {
		return nil, err
	}
	defer srv.close()
	sched := newSchedule(cfg.Seed, cfg.Drop, cfg.Reset, cfg.Delay)
	proxy, err := faultnet.Start(srv.url, faultnet.Config{Decide: sched.decide, Delay: cfg.DelayFor})
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	defer proxy.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Callers}
	defer tr.CloseIdleConnections()
	attempts := newAttemptLog(tr)
	clientOpts := append([]idempotency.Option{
		idempotency.WithHTTPClient(&http.Client{Transport: attempts}),
		idempotency.WithAttemptTimeout(cfg.AttemptTimeout),
	}, cfg.ClientOptions...)
	client, err := idempotency.NewClient(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}
	// The audit checks the records, not the client: its retries must not
	// depend on what the faults left of the run's retry budget, which on a
	// slow machine is nothing.
	auditClient, err := idempotency.NewClient(append(clientOpts, idempotency.WithoutBudget())...)
	if err != nil {
		return nil, fmt.Errorf("faultrun: %w", err)
	}

	r := &runner{cfg: cfg, link: link, url: proxy.URL() + "/orders", client: client, auditClient: auditClient, proxy: proxy, sched: sched, log: log}
	r.orders = make([]*order, cfg.Orders)
	for i := range r.orders {
		ref := fmt.Sprintf("order-%06d", i)
		r.orders[i] = &order{ref: ref, key: "key-" + ref, body: `{"ref":"` + ref + `"}`}
	}

	began := time.Now()
	if err := r.underFaults(ctx); err != nil {
		return nil, err
	}
	faultsEnded := time.Now()
	sched.calm.Store(true)
	if err := r.settle(ctx); err != nil {
		return nil, err
	}
	settled := time.Now()

	rep := &Report{
		Seed:          cfg.Seed,
		Orders:        cfg.Orders,
		Network:       proxy.Stats(),
		Faults:        sched.faults(),
		ClientAnswers: attempts.snapshot(),
		ServerAnswers: log.answers(),
		ServerLogged:  logged.snapshot(),
		UnderFaults:   faultsEnded.Sub(began),
		Settling:      settled.Sub(faultsEnded),
		Windows:       r.windows,
	}
	rep.Amplification = float64(rep.Network.Requests) / float64(cfg.Orders)
	r.tally(rep, api)
	if err := r.audit(ctx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// underFaults is the first phase: every order gets its calls while the
// network faults and the windows are on.
func (r *runner) underFaults(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	marks := make([]chan struct{}, len(r.cfg.Windows))
	for i := range marks {
		marks[i] = make(chan struct{})
	}
	timeline := make(chan struct{})
	go func() {
		defer close(timeline)
		r.timeline(ctx, marks)
	}()

	next := make(chan *order)
	var callers sync.WaitGroup
	for range r.cfg.Callers {
		callers.Go(func() {
			for o := range next {
				for c := range r.cfg.Calls {
					if c > 0 && !pause(ctx, r.cfg.ResumeAfter) {
						break
					}
					if r.call(ctx, o) {
						o.phase = 1
						break
					}
				}
			}
		})
	}
	for i, o := range r.orders {
		for w, win := range r.cfg.Windows {
			if win.After == i {
				close(marks[w])
			}
		}
		select {
		case next <- o:
		case <-ctx.Done():
		}
	}
	close(next)
	callers.Wait()
	<-timeline
	return ctx.Err()
}

// timeline turns each window's fault on when its mark is closed, and off
// when it has lasted its time.
func (r *runner) timeline(ctx context.Context, marks []chan struct{}) {
	for i, w := range r.cfg.Windows {
		select {
		case <-marks[i]:
		case <-ctx.Done():
			return
		}
		// The window is the time the fault is surely on: from after it
		// was turned on to before it is turned off, so that no request
		// that met the store before the fault counts as one that met it.
		r.faultOn(w)
		rep := WindowReport{Window: w, Start: time.Now()}
		t := time.NewTimer(w.For)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		rep.End = time.Now()
		r.faultOff(w)
		r.mu.Lock()
		r.windows = append(r.windows, rep)
		r.mu.Unlock()
	}
}

func (r *runner) faultOn(w Window) {
	switch w.Fault {
	case Blackhole:
		r.proxy.SetBlackhole(true)
	case StoreCut:
		r.link.Cut()
	case StoreSlow:
		r.link.Slow(w.Latency)
	}
}

func (r *runner) faultOff(w Window) {
	if w.Fault == Blackhole {
		r.proxy.SetBlackhole(false)
		return
	}
	r.link.Heal()
}

// settle is the second phase: with every fault off, the orders not yet
// confirmed are resumed, with their keys, until they are.
func (r *runner) settle(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Settle)
	defer cancel()
	next := make(chan *order)
	var callers sync.WaitGroup
	for range r.cfg.Callers {
		callers.Go(func() {
			for o := range next {
				for !r.call(ctx, o) {
					if !pause(ctx, r.cfg.ResumeAfter) {
						break
					}
				}
				if !o.confirmed.IsZero() {
					o.phase = 2
				}
			}
		})
	}
	for _, o := range r.orders {
		if o.phase != 0 {
			continue
		}
		select {
		case next <- o:
		case <-ctx.Done():
		}
	}
	close(next)
	callers.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err // the caller's context, not the settling time
	}
	return nil
}

// call makes one call of the client for o, and reports whether it
// confirmed the order.
func (r *runner) call(ctx context.Context, o *order) bool {
	o.calls++
	if o.first.IsZero() {
		o.first = time.Now()
	}
	id, attempts, _, err := r.post(ctx, r.client, o)
	o.attempts += attempts
	if err != nil {
		return false
	}
	o.id, o.confirmed = id, time.Now()
	return true
}

// post sends o once through client and returns the order number it was
// given, the attempts made and whether the answer was a replay.
func (r *runner) post(ctx context.Context, client *idempotency.Client, o *order) (id, attempts int, replayed bool, err error) {
	resp, err := client.Post(idempotency.ContextWithKey(ctx, o.key), r.url, "application/json", strings.NewReader(o.body))
	if err != nil {
		var re *idempotency.RetryError
		if errors.As(err, &re) {
			attempts = re.Attempts
		}
		return 0, attempts, false, err
	}
	defer resp.Body.Close()
	out, _ := idempotency.OutcomeOf(resp)
	if resp.StatusCode != http.StatusCreated {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, out.Attempts, out.Replayed, fmt.Errorf("faultrun: status %d", resp.StatusCode)
	}
	var body struct {
		ID  int
		Ref string
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, out.Attempts, out.Replayed, fmt.Errorf("faultrun: order: %w", err)
	}
	if body.Ref != o.ref || body.ID <= 0 {
		return 0, out.Attempts, out.Replayed, fmt.Errorf("faultrun: answer %+v for order %s", body, o.ref)
	}
	return body.ID, out.Attempts, out.Replayed, nil
}

// audit is the third phase: every order once more, which must be a replay
// of the response its caller got.
func (r *runner) audit(ctx context.Context, rep *Report) error {
	next := make(chan *order)
	var (
		mu      sync.Mutex
		callers sync.WaitGroup
	)
	for range r.cfg.Callers {
		callers.Go(func() {
			for o := range next {
				id, _, replayed, err := r.post(ctx, r.auditClient, o)
				mu.Lock()
				switch {
				case err != nil:
					rep.AuditFailed++
					if len(rep.mismatched) < 5 {
						rep.mismatched = append(rep.mismatched, fmt.Sprintf("%s: %v", o.ref, err))
					}
				case !replayed || id != o.id:
					rep.AuditMismatched++
					if len(rep.mismatched) < 5 {
						rep.mismatched = append(rep.mismatched, fmt.Sprintf("%s: answered %d (replayed %v), confirmed %d", o.ref, id, replayed, o.id))
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, o := range r.orders {
		if o.phase == 0 {
			continue
		}
		select {
		case next <- o:
		case <-ctx.Done():
		}
	}
	close(next)
	callers.Wait()
	return ctx.Err()
}

// pause waits d, and reports false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
