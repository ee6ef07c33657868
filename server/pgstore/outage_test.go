package pgstore_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/pgstore"
)

// proxyMode is what a proxy does with traffic.
type proxyMode int

const (
	forwarding proxyMode = iota
	// refusing resets the open connections and closes new ones at once: a
	// server that is down.
	refusing
	// blackHole forwards nothing either way and answers nothing, but keeps
	// connections open: a network partition.
	blackHole
)

// proxy is a TCP proxy on a loopback port of its own, in front of the
// shared PostgreSQL, that a test cuts without touching the server.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	mode  proxyMode
	conns map[net.Conn]struct{}
	// held are the connections accepted while the proxy was a black hole,
	// never connected upstream.
	held []net.Conn
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *proxy) set(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	switch m {
	case refusing:
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	case forwarding:
		// A connection whose start was lost in the partition is reset
		// when it heals; pgxpool would otherwise wait for it in the
		// background for its connect timeout.
		for _, c := range p.held {
			c.Close()
		}
		p.held = nil
	}
}

func (p *proxy) current() proxyMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// track adds c to the connections that refusing and close reset; it reports
// false, having closed c, when the proxy refuses connections.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == refusing {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// hold keeps c open, unanswered, when the proxy is a black hole.
func (p *proxy) hold(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != blackHole {
		return false
	}
	p.held = append(p.held, c)
	return true
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		if p.hold(c) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			if !p.track(u) {
				c.Close()
				return
			}
			p.wg.Add(2)
			go p.pipe(u, c)
			go p.pipe(c, u)
		}()
	}
}

// pipe copies src to dst until either fails; it drops what it reads while
// the proxy is a black hole.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.current() == forwarding {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

func (p *proxy) close() {
	p.ln.Close()
	p.set(refusing)
	p.wg.Wait()
}

// TestOutage cuts the database off, in the two ways it goes away, and checks
// that every operation fails promptly with a store error, never
// ErrLeaseLost, that no error shows the password, and that the store works
// again once the database is back.
func TestOutage(t *testing.T) {
	ctx := testContext(t)
	direct := newPool(t)
	_, table := newStore(t, direct) // the table outlives the proxy

	cfg := poolConfig(t)
	p := startProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", p.port()
	// The test server trusts loopback and ignores the password; an error
	// message must never show it.
	const secret = "pw-that-must-not-leak-7f3a"
	cfg.ConnConfig.Password = secret
	cfg.MaxConns = 4
	pool := connect(t, cfg)
	s, err := pgstore.New(pool, pgstore.WithTable(table))
	require.NoError(t, err)
	defer s.Close()

	id := scopeID("outage")
	tok := acquire(t, ctx, s, id, "fp")
	ops := []struct {
		name string
		call func(context.Context) error
	}{
		{"Claim", func(ctx context.Context) error {
			_, err := s.Claim(ctx, scopeID("new"), "fp", time.Minute, time.Hour)
			return err
		}},
		{"Claim of the held key", func(ctx context.Context) error {
			_, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			return err
		}},
		{"Extend", func(ctx context.Context) error { return s.Extend(ctx, id, tok, time.Minute) }},
		{"Complete", func(ctx context.Context) error { return s.Complete(ctx, id, tok, created(`{}`), time.Hour) }},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, id, tok) }},
		{"Sweep", func(ctx context.Context) error { _, err := s.Sweep(ctx, 10); return err }},
		{"Migrate", func(ctx context.Context) error { return s.Migrate(ctx) }},
	}
	for _, tc := range []struct {
		name     string
		mode     proxyMode
		deadline time.Duration
	}{
		{"server down", refusing, 5 * time.Second},
		{"partition", blackHole, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.set(tc.mode)
			defer p.set(forwarding)
			for _, op := range ops {
				opCtx, cancel := context.WithTimeout(ctx, tc.deadline)
				start := time.Now()
				err := op.call(opCtx)
				elapsed := time.Since(start)
				cancel()
				t.Logf("%s: %v after %v", op.name, err, elapsed.Round(time.Millisecond))
				if !assert.Error(t, err, "%s during the outage", op.name) {
					continue
				}
				assert.NotErrorIs(t, err, server.ErrLeaseLost, "%s error", op.name)
				assert.True(t, strings.HasPrefix(err.Error(), "pgstore: "), "%s error %q lacks the prefix", op.name, err)
				assert.NotContains(t, err.Error(), secret, "%s error shows the password", op.name)
				assert.Less(t, elapsed, tc.deadline+time.Second, "%s took %v with a deadline of %v", op.name, elapsed, tc.deadline)
			}
		})
	}

	// Back: the lease survived the outage, and its holder completes it. The
	// pool may hand out a connection that died in the outage once, so the
	// first call may fail.
	eventually(t, 10*time.Second, "Extend after the outage", func() bool {
		return s.Extend(ctx, id, tok, time.Minute) == nil
	})
	require.NoError(t, s.Complete(ctx, id, tok, created(`{"after":"outage"}`), time.Hour))
	c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, server.Completed, c.Status)
}
