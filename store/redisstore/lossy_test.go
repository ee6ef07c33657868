package redisstore_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// lossyProxy forwards connections to a Redis, and drops a share of its
// replies: the command has run, its answer never arrives, the connection is
// cut, and the client sends the command again.
type lossyProxy struct {
	l        net.Listener
	upstream string
	dropRate float64
	dropped  atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
}

func startLossyProxy(t *testing.T, upstream string, dropRate float64) *lossyProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{l: l, upstream: upstream, dropRate: dropRate, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *lossyProxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Go(func() { io.Copy(up, c); up.Close(); c.Close() })
		p.wg.Go(func() { p.replies(c, up) })
	}
}

// replies copies what the server answers, and cuts the connection instead
// of a reply now and then.
func (p *lossyProxy) replies(client, up net.Conn) {
	defer client.Close()
	defer up.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		if rand.Float64() < p.dropRate {
			p.dropped.Add(1)
			return
		}
		if _, err := client.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *lossyProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil { // closed
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *lossyProxy) close() {
	p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// 1,000 orders through a connection that loses one reply in ten: each order
// runs exactly once. The client's own retries send a lost claim or
// completion again, and the function recognises it; when even those are lost,
// the caller retries as the middleware's client would, and the record's
// lease settles it.
func TestLossyConnection(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	prefix := testPrefix(t, shared)
	opt := sharedOptions(t)
	proxy := startLossyProxy(t, opt.Addr, 0.1)
	opt.Addr = proxy.l.Addr().String()
	opt.MinRetryBackoff, opt.MaxRetryBackoff = time.Millisecond, 5*time.Millisecond
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}

	const orders, workers = 1000, 16
	const lease = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		executions [orders]atomic.Int32
		claimErrs  atomic.Int64
		doneErrs   atomic.Int64
		waits      atomic.Int64
		next       atomic.Int64
		wg         sync.WaitGroup
		failure    = make(chan error, workers)
	)
	// order runs one order to completion, retrying like a client: on a store
	// error, on in flight (wait for the lease), and on a completion whose
	// outcome is unknown.
	order := func(i int) error {
		id := engine.ID{Scope: "lossy", Key: strconv.Itoa(i)}
		for ctx.Err() == nil {
			cl, err := s.Claim(ctx, id, "fp", lease, time.Hour)
			if err != nil {
				claimErrs.Add(1)
				continue
			}
			switch cl.Status {
			case engine.Completed:
				if string(cl.Response.Body) != id.Key {
					return errors.New("order " + id.Key + " replayed " + string(cl.Response.Body))
				}
				return nil
			case engine.InFlight:
				// Our own claim, whose every reply was lost: wait out
				// its lease, as a client honouring Retry-After would.
				waits.Add(1)
				select {
				case <-ctx.Done():
				case <-time.After(cl.RetryAfter + time.Millisecond):
				}
				continue
			}
			executions[i].Add(1)
			resp := &engine.Response{Status: 201, Body: []byte(id.Key)}
			for ctx.Err() == nil {
				err := s.Complete(ctx, id, cl.Token, resp, time.Hour)
				if err == nil || errors.Is(err, engine.ErrLeaseLost) {
					break // done, or done by an attempt whose reply was lost
				}
				doneErrs.Add(1)
			}
		}
		return ctx.Err()
	}
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < orders; i = int(next.Add(1) - 1) {
				if err := order(i); err != nil {
					failure <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(failure)
	for err := range failure {
		t.Fatal(err)
	}
	for i := range executions {
		if n := executions[i].Load(); n != 1 {
			t.Errorf("order %d ran %d times, want exactly once", i, n)
		}
	}
	t.Logf("%d replies dropped; after the client's own retries, %d claims and %d completions failed, "+
		"and %d claims found their own earlier attempt in flight",
		proxy.dropped.Load(), claimErrs.Load(), doneErrs.Load(), waits.Load())
	if proxy.dropped.Load() == 0 {
		t.Error("the proxy dropped no reply: the test tested nothing")
	}
	// A claim resent by the client recognises itself: only a claim that
	// failed outright leaves a lease for its caller to wait out.
	if waits.Load() > claimErrs.Load() {
		t.Errorf("%d claims found their own lease in flight, want at most %d, the claims that failed",
			waits.Load(), claimErrs.Load())
	}
}
