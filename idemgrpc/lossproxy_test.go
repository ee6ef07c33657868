package idemgrpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc/stats"
)

// lossProxy is a loopback TCP proxy in front of a gRPC server that loses
// the answers of the calls it is told to: once the server has begun such a
// call (its stats Begin), nothing the server sends reaches the client, and
// when the server has finished it (its stats End, after it wrote the
// status) the proxy resets every connection. The server ran the call; the client sees its connection fail
// (Unavailable) and never sees the answer. Arm it before a call made while
// no other call is under way, so that exactly that call's answer is lost.
type lossProxy struct {
	upstream string
	ln       net.Listener
	wg       sync.WaitGroup

	mu     sync.Mutex
	armed  int     // answers still to lose
	doomed *rpcTag // the call under way whose answer is lost, if any
	lost   int     // answers lost
	conns  map[*proxyConn]struct{}
	closed bool
}

type proxyConn struct {
	client, server net.Conn
	once           sync.Once
	dead           bool // guarded by the proxy's mu: nothing more is forwarded
}

func (c *proxyConn) kill() {
	c.once.Do(func() {
		if tc, ok := c.client.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, as a failed network gives
		}
		c.client.Close()
		c.server.Close()
	})
}

func startLossProxy(upstream string) (*lossProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &lossProxy{upstream: upstream, ln: ln, conns: make(map[*proxyConn]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *lossProxy) Addr() string { return p.ln.Addr().String() }

func (p *lossProxy) accept() {
	defer p.wg.Done()
	for {
		cl, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			cl.Close()
			continue
		}
		c := &proxyConn{client: cl, server: up}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.kill()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			io.Copy(up, cl)
			p.drop(c)
		}()
		go func() {
			defer p.wg.Done()
			p.back(c)
			p.drop(c)
		}()
	}
}

// back copies the server's bytes to the client, unless the proxy is armed.
func (p *lossProxy) back(c *proxyConn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			swallow := p.doomed != nil || c.dead
			p.mu.Unlock()
			if !swallow {
				if _, werr := c.client.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *lossProxy) drop(c *proxyConn) {
	c.kill()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Arm makes the proxy lose the answers of the next n calls to finish.
func (p *lossProxy) Arm(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = n
	if n == 0 {
		p.doomed = nil
	}
}

// Lost returns how many answers the proxy has lost.
func (p *lossProxy) Lost() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// begun is called when the server begins a call: if armed, what it sends
// from now on is lost.
func (p *lossProxy) begun(call *rpcTag) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed > 0 && p.doomed == nil {
		p.doomed = call
	}
}

// finished is called when the server has finished a call: if its answer is
// to be lost, it is lost with every connection. The End of an earlier call
// may come after the next call began (its client had its answer already):
// it is not that call's.
func (p *lossProxy) finished(call *rpcTag) {
	p.mu.Lock()
	if p.doomed == nil || p.doomed != call {
		p.mu.Unlock()
		return
	}
	p.doomed = nil
	p.armed--
	p.lost++
	victims := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		c.dead = true // the bytes the server writes after End are lost too
		victims = append(victims, c)
		delete(p.conns, c)
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.kill()
	}
}

// Close stops the proxy, closes its connections and waits for its
// goroutines.
func (p *lossProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	victims := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		victims = append(victims, c)
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.kill()
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// StatsHandler returns the server stats handler that tells the proxy when a
// call has finished.
func (p *lossProxy) StatsHandler() stats.Handler { return lossHook{p} }

type lossHook struct{ p *lossProxy }

// rpcTag tells one call's stats from another's.
type rpcTag struct{ _ byte }

type rpcTagKey struct{}

func (h lossHook) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, rpcTagKey{}, new(rpcTag))
}

func (h lossHook) HandleRPC(ctx context.Context, s stats.RPCStats) {
	call, _ := ctx.Value(rpcTagKey{}).(*rpcTag)
	if call == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		h.p.begun(call)
	case *stats.End:
		h.p.finished(call)
	}
}
func (h lossHook) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h lossHook) HandleConn(context.Context, stats.ConnStats)                       {}
