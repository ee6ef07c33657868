// Package faultnet is a loopback HTTP proxy that loses, resets and delays
// requests on their way to one upstream server, so that tests and demos can
// exercise retries against a network that fails in the ways that matter for
// idempotency: a request that ran on the server but whose response never
// arrived (Drop), a connection refused before the server saw anything
// (Reset), and a response that arrives after the client stopped waiting
// (Delay).
//
// Start a Proxy in front of an upstream such as an httptest.Server and point
// the client at Proxy.URL. Every request is given one Fault, chosen by
// Config.Decide or drawn at random with the Config's rates, and counted in
// Stats. SetBlackhole holds all traffic for a while, as a network partition
// does. Close stops the proxy and waits for the goroutines it started.
//
// TCPProxy does the same below HTTP, for the connections of a client to its
// database: it cuts, black-holes or slows them while the test runs.
//
// The proxy speaks HTTP/1.1 with keep-alive on both sides. It forwards the
// method, the request target, the Host and every end-to-end header unchanged
// and adds none; it copies the response status, headers and body. It does
// not forward trailers, protocol upgrades or interim (1xx) responses.
//
// Beware that net/http's Transport, on its own, sends a request once more
// when a reused keep-alive connection fails before the response starts, if
// the request is replayable: a GET, HEAD, OPTIONS or TRACE, or any method
// with an Idempotency-Key header, with no body or a GetBody. A Drop or Reset
// may therefore be answered by that hidden second attempt, which the proxy
// sees, counts and decides as a request of its own. A test that needs exactly
// one attempt per call uses a fresh connection or a request that is not
// replayable.
package faultnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what the proxy does to one request.
type Fault int

const (
	// Pass forwards the request and sends the upstream's response back.
	Pass Fault = iota
	// Drop forwards the request, reads the upstream's whole response (so the
	// upstream handler has run to completion), then closes the client's
	// connection without sending any of it: the request succeeded on the
	// server, and the client sees an error.
	Drop
	// Reset aborts the client's connection with a TCP RST before forwarding
	// anything: the upstream never sees the request.
	Reset
	// Delay forwards the request, reads the upstream's whole response and
	// holds it for Config.Delay before sending it, so that a client with a
	// shorter timeout has given up by then. The hold ends early, without a
	// response, when the client goes away or the proxy is closed.
	Delay
)

// String returns the fault's name in lower case, such as "drop".
func (f Fault) String() string {
	if f.valid() {
		return [...]string{"pass", "drop", "reset", "delay"}[f]
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

func (f Fault) valid() bool { return f >= Pass && f <= Delay }

// defaultDelay is how long a Delay holds a response when Config.Delay is
// zero: far beyond a test client's per-attempt timeout, short enough not to
// stall a demo.
const defaultDelay = 2 * time.Second

// Config says which faults a Proxy injects. The zero Config passes every
// request.
type Config struct {
	// DropRate, ResetRate and DelayRate are the probabilities, each in
	// [0, 1] and together at most 1, that a request is given Drop, Reset or
	// Delay; the other requests pass.
	DropRate, ResetRate, DelayRate float64

	// Delay is how long a delayed response is held. Zero means 2s.
	Delay time.Duration

	// Seed seeds the random choice made with the rates (a PCG from
	// math/rand/v2), so that the sequence of faults given to the 1st, 2nd,
	// ... request is the same on every run. Requests sent one after another
	// therefore meet the same faults; concurrent requests draw from that
	// sequence in the order they arrive. Zero means a random seed.
	Seed uint64

	// Decide, if set, replaces the rates. It is called once per request,
	// before anything is forwarded, with the request's sequence number
	// (1 for the first request the proxy receives) and the request, whose
	// body it must not read. It is called from concurrent goroutines. A value
	// other than the four Faults is treated as Pass.
	Decide func(n int64, r *http.Request) Fault
}

func (c Config) validate() error {
	for _, r := range []float64{c.DropRate, c.ResetRate, c.DelayRate} {
		if !(r >= 0 && r <= 1) { // also rejects NaN
			return fmt.Errorf("faultnet: rate %v is outside [0, 1]", r)
		}
	}
	// Allow for rounding: 0.1+0.2+0.7 is a little above 1 in float64.
	if sum := c.DropRate + c.ResetRate + c.DelayRate; sum > 1+1e-9 {
		return fmt.Errorf("faultnet: rates add up to %v, more than 1", sum)
	}
	if c.Delay < 0 {
		return fmt.Errorf("faultnet: negative delay %v", c.Delay)
	}
	return nil
}

// Stats counts what a Proxy has done. Every request is counted once in
// Requests and once under the fault it was given, as soon as the fault is
// chosen, so Requests = Passed + Dropped + Reset + Delayed in every snapshot.
type Stats struct {
	Requests int64 // requests received
	Passed   int64 // requests given Pass
	Dropped  int64 // requests given Drop
	Reset    int64 // requests given Reset
	Delayed  int64 // requests given Delay

	// UpstreamErrors counts the requests, among the above, for which the
	// upstream gave no response (it could not be reached, or the
	// connection to it failed) other than because of Close. A passed or
	// delayed request is then answered at once with 502 Bad Gateway; a
	// dropped one is dropped all the same.
	UpstreamErrors int64

	// Blackholed counts the requests, among the above, that a black hole
	// held on their way in or on their way back (see SetBlackhole).
	Blackholed int64
}

// Proxy is a running fault-injecting proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	cfg       Config
	base      string // upstream URL without a trailing slash
	ln        net.Listener
	srv       *http.Server
	transport *http.Transport
	seq       atomic.Int64

	ctx    context.Context // canceled by Close: ends upstream requests and held responses
	cancel context.CancelFunc
	conns  sync.WaitGroup // client connections not yet closed
	served chan struct{}  // closed when Serve has returned
	serr   error          // Serve's error, read after served is closed

	mu             sync.Mutex
	rng            *rand.Rand
	counts         [Delay + 1]int64 // requests given each Fault
	upstreamErrors int64
	blackholed     int64
	blackhole      bool
	bhChanged      chan struct{} // closed, and replaced, when blackhole changes

	closeOnce sync.Once
	closeErr  error
}

// Start listens on a free port of 127.0.0.1 and proxies requests to
// upstream, an http:// base URL such as an httptest.Server's URL. A path in
// upstream is prefixed to every request's path. The caller must Close the
// Proxy.
func Start(upstream string, cfg Config) (*Proxy, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("faultnet: upstream: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("faultnet: upstream %q is not a plain http:// base URL", upstream)
	}
	if cfg.Delay == 0 {
		cfg.Delay = defaultDelay
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		cfg:  cfg,
		base: strings.TrimSuffix(u.String(), "/"),
		ln:   ln,
		transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // pass Accept-Encoding and bodies through untouched
		},
		ctx:       ctx,
		cancel:    cancel,
		served:    make(chan struct{}),
		rng:       rand.New(rand.NewPCG(seed, seed)),
		bhChanged: make(chan struct{}),
	}
	p.srv = &http.Server{
		Handler:   http.HandlerFunc(p.serveHTTP),
		ConnState: p.connState,
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(p.served)
		p.serr = p.srv.Serve(ln)
	}()
	return p, nil
}

// connState tracks client connections so that Close can wait for their
// goroutines. Serve reports StateNew before it returns, so every Add happens
// before Close's Wait. A hijacked connection is accounted for by abort.
func (p *Proxy) connState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		p.conns.Add(1)
	case http.StateClosed:
		p.conns.Done()
	}
}

// URL returns the proxy's base URL, such as "http://127.0.0.1:41234".
func (p *Proxy) URL() string {
	return "http://" + p.ln.Addr().String()
}

// Stats returns a snapshot of the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counts
	return Stats{
		Requests:       c[Pass] + c[Drop] + c[Reset] + c[Delay],
		Passed:         c[Pass],
		Dropped:        c[Drop],
		Reset:          c[Reset],
		Delayed:        c[Delay],
		UpstreamErrors: p.upstreamErrors,
		Blackholed:     p.blackholed,
	}
}

// SetBlackhole starts (on) or ends (off) a black hole: while it lasts,
// nothing passes either way. A request that arrives is given its fault and
// counted as usual, then held before anything is forwarded; a response (or
// the closing of a dropped connection) is held before its first byte is
// sent back, while one already under way goes on. When the black hole ends, what was held goes on, as TCP
// delivers once a partition heals: a held request reaches the upstream even
// if its client has stopped waiting by then, unless the proxy saw the client
// leave. Close ends the hold without forwarding anything.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole == on {
		return
	}
	p.blackhole = on
	close(p.bhChanged)
	p.bhChanged = make(chan struct{})
}

// through waits while a black hole lasts. It reports false if the client
// went away or the proxy was closed first. held records whether this
// request has already been counted as held.
func (p *Proxy) through(ctx context.Context, held *bool) bool {
	for {
		p.mu.Lock()
		on, changed := p.blackhole, p.bhChanged
		if on && !*held {
			*held = true
			p.blackholed++
		}
		p.mu.Unlock()
		if !on {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		case <-p.ctx.Done():
			return false
		}
	}
}

// Close stops listening, closes every client connection (a held, delayed
// response is abandoned at once, without being sent), cancels the requests in
// flight to the upstream, waits until every request handler has returned and
// closes the idle connections to the upstream. It returns promptly even if
// the upstream hangs. Calling Close again does nothing and returns the same
// error.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		err := p.srv.Close()
		<-p.served
		p.conns.Wait()
		p.transport.CloseIdleConnections()
		if !errors.Is(p.serr, http.ErrServerClosed) {
			err = errors.Join(err, p.serr)
		}
		if err != nil {
			p.closeErr = fmt.Errorf("faultnet: close: %w", err)
		}
	})
	return p.closeErr
}
