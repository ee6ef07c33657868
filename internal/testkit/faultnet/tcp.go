package faultnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// TCPProxy is a loopback TCP proxy in front of one upstream address, such as
// a PostgreSQL or Redis server, whose link a test can cut, black-hole or slow
// down while clients use it, and heal again. It forwards bytes unchanged and
// knows nothing of the protocol: what a client sees is what it would see of
// the network failing under it.
//
// The link is in one condition at a time, set by Cut, Blackhole, Slow and
// Heal:
//
//   - healthy (the start, and after Heal): bytes pass as they arrive; bytes
//     held by an earlier condition are delivered at once;
//   - cut: every connection is reset (TCP RST) on both sides, and a new
//     connection is reset as soon as it is accepted, as when a server is
//     down or a firewall rejects it;
//   - black hole: connections stay open and new ones are accepted, but no
//     byte passes either way; the bytes wait and are delivered after Heal,
//     as TCP delivers them once a partition ends, if the connection is
//     still open by then;
//   - slow: every byte is delivered a fixed latency after it was read, both
//     ways.
//
// A connection one side closes is closed on the other once what it sent
// before closing has been delivered. Close stops the proxy. The methods are
// safe for concurrent use.
type TCPProxy struct {
	upstream string
	ln       net.Listener
	ctx      context.Context // canceled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the accept loop and every session's pumps

	mu       sync.Mutex
	cond     linkCondition
	latency  time.Duration
	changed  chan struct{} // closed, and replaced, whenever the condition changes
	sessions map[*session]struct{}
	stats    TCPStats
	closed   bool

	closeOnce sync.Once
}

type linkCondition int

const (
	linkHealthy linkCondition = iota
	linkCut
	linkBlackhole
)

// TCPStats counts what a TCPProxy has done.
type TCPStats struct {
	Accepted int64 // connections accepted and forwarded to the upstream
	Refused  int64 // connections reset as soon as accepted, while cut
	Severed  int64 // open connections reset by Cut
	Failed   int64 // connections closed because the upstream could not be reached
}

// StartTCP listens on a free port of 127.0.0.1 and forwards every connection
// to upstream, a host:port. The link starts healthy. The caller must Close
// the proxy.
func StartTCP(upstream string) (*TCPProxy, error) {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return nil, fmt.Errorf("faultnet: upstream %q: %w", upstream, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &TCPProxy{
		upstream: upstream,
		ln:       ln,
		ctx:      ctx,
		cancel:   cancel,
		changed:  make(chan struct{}),
		sessions: make(map[*session]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's address, such as "127.0.0.1:41234".
func (p *TCPProxy) Addr() string { return p.ln.Addr().String() }

// Stats returns a snapshot of the proxy's counters.
func (p *TCPProxy) Stats() TCPStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Cut resets every open connection and every new one until Heal.
func (p *TCPProxy) Cut() {
	p.mu.Lock()
	p.setLocked(linkCut, 0)
	victims := make([]*session, 0, len(p.sessions))
	for s := range p.sessions {
		victims = append(victims, s)
	}
	p.stats.Severed += int64(len(victims))
	p.mu.Unlock()
	for _, s := range victims {
		s.kill(true)
	}
}

// Blackhole stops every byte, both ways, until Heal; connections stay open.
func (p *TCPProxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setLocked(linkBlackhole, 0)
}

// Slow delays every byte by latency, both ways, until Heal. A latency of 0
// or less heals the link.
func (p *TCPProxy) Slow(latency time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setLocked(linkHealthy, max(latency, 0))
}

// Heal makes the link healthy: what was held is delivered at once.
func (p *TCPProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setLocked(linkHealthy, 0)
}

func (p *TCPProxy) setLocked(c linkCondition, latency time.Duration) {
	p.cond, p.latency = c, latency
	close(p.changed)
	p.changed = make(chan struct{})
}

// condition returns the link's condition and a channel closed when it next
// changes.
func (p *TCPProxy) condition() (linkCondition, time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cond, p.latency, p.changed
}

// Close stops listening, closes every connection and waits for the
// goroutines the proxy started. Calling it again does nothing.
func (p *TCPProxy) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.cancel()
		err = p.ln.Close()
		p.mu.Lock()
		p.closed = true
		victims := make([]*session, 0, len(p.sessions))
		for s := range p.sessions {
			victims = append(victims, s)
		}
		p.mu.Unlock()
		for _, s := range victims {
			s.kill(false)
		}
		p.wg.Wait()
		if err != nil {
			err = fmt.Errorf("faultnet: close: %w", err)
		}
	})
	return err
}

func (p *TCPProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, or a connection that failed before it
			// was accepted: do not spin.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		cut := p.cond == linkCut
		if cut {
			p.stats.Refused++
		}
		p.mu.Unlock()
		if cut {
			reset(c)
			continue
		}
		p.wg.Add(1)
		go p.connect(c)
	}
}

// connect dials the upstream for the client connection c and starts the
// session's pumps.
func (p *TCPProxy) connect(c net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: 5 * time.Second}
	u, err := d.DialContext(p.ctx, "tcp", p.upstream)
	if err != nil {
		p.mu.Lock()
		p.stats.Failed++
		p.mu.Unlock()
		reset(c)
		return
	}
	s := &session{client: c, server: u, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.cond == linkCut {
		// Cut or Close ran while the upstream was dialled.
		if !p.closed {
			p.stats.Severed++
		}
		p.mu.Unlock()
		s.kill(true)
		return
	}
	p.sessions[s] = struct{}{}
	p.stats.Accepted++
	p.mu.Unlock()

	var pumps sync.WaitGroup
	pumps.Add(2)
	go p.pump(s, c, u, &pumps)
	go p.pump(s, u, c, &pumps)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		pumps.Wait()
		p.mu.Lock()
		delete(p.sessions, s)
		p.mu.Unlock()
	}()
}

// chunk is bytes read from one side, with the time they were read.
type chunk struct {
	b  []byte
	at time.Time
}

// chunkSize and queued bound what a direction holds: beyond that the proxy
// stops reading, and the sender's TCP window fills up.
const (
	chunkSize = 32 << 10
	queued    = 64
)

// pump moves bytes from src to dst: a reader that queues what arrives, and a
// writer that delivers it when the link allows. When src ends, what was read
// is delivered, then the session is closed.
func (p *TCPProxy) pump(s *session, src, dst net.Conn, wg *sync.WaitGroup) {
	defer wg.Done()
	q := make(chan chunk, queued)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(q)
		for {
			buf := make([]byte, chunkSize)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{b: buf[:n], at: time.Now()}:
				case <-s.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if !p.deliverable(s, c.at) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			s.kill(false)
			return
		}
	}
	s.kill(false)
}

// deliverable waits until a chunk read at at may be delivered: the link is
// not a black hole and its latency has passed. It reports false if the
// session was closed first.
func (p *TCPProxy) deliverable(s *session, at time.Time) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		cond, latency, changed := p.condition()
		var wait <-chan time.Time
		switch {
		case cond == linkBlackhole:
		case cond == linkCut:
			// Cut kills the session; its pumps end.
		case time.Until(at.Add(latency)) <= 0:
			return true
		default:
			if timer == nil {
				timer = time.NewTimer(time.Until(at.Add(latency)))
			} else {
				timer.Reset(time.Until(at.Add(latency)))
			}
			wait = timer.C
		}
		select {
		case <-s.done:
			return false
		case <-changed:
		case <-wait:
			return true
		}
	}
}

// session is one client connection and its upstream connection.
type session struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
}

// kill closes both connections, with a TCP RST if rst is set, and stops the
// session's pumps.
func (s *session) kill(rst bool) {
	s.once.Do(func() {
		close(s.done)
		if rst {
			reset(s.client)
			reset(s.server)
			return
		}
		_ = s.client.Close()
		_ = s.server.Close()
	})
}

// reset closes c with a TCP RST rather than an orderly FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
