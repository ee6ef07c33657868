package faultnet_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
)

// tcpEcho is a TCP server that sends back what it receives, and reports on
// received what each connection sent before it closed.
type tcpEcho struct {
	ln       net.Listener
	received chan []byte
}

func newTCPEcho(t *testing.T) *tcpEcho {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := &tcpEcho{ln: ln, received: make(chan []byte, 16)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				var all bytes.Buffer
				_, _ = io.Copy(io.MultiWriter(c, &all), c)
				select {
				case e.received <- all.Bytes():
				default:
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return e
}

func startTCP(t *testing.T, upstream string) *faultnet.TCPProxy {
	t.Helper()
	p, err := faultnet.StartTCP(upstream)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, patient)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg on c and reads as many bytes back, within d.
func roundTrip(c net.Conn, msg []byte, d time.Duration) ([]byte, error) {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	defer c.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		errc <- err
	}()
	got := make([]byte, len(msg))
	_, rerr := io.ReadFull(c, got)
	if werr := <-errc; werr != nil {
		return nil, werr
	}
	return got, rerr
}

func TestStartTCPRejects(t *testing.T) {
	for _, upstream := range []string{"", "127.0.0.1", "no port"} {
		p, err := faultnet.StartTCP(upstream)
		assert.Error(t, err, "StartTCP(%q)", upstream)
		assert.Nil(t, p)
	}
}

func TestTCPForwards(t *testing.T) {
	e := newTCPEcho(t)
	p := startTCP(t, e.ln.Addr().String())
	c := dial(t, p.Addr())

	big := make([]byte, 1<<20)
	rand.Read(big)
	for _, msg := range [][]byte{[]byte("PING\r\n"), big} {
		got, err := roundTrip(c, msg, patient)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(msg, got), "echoed %d bytes differ from the %d sent", len(got), len(msg))
	}
	// A client that closes is closed upstream once its bytes are there.
	_, err := c.Write([]byte("bye"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	all := waitFor(t, e.received, patient, "upstream connection closing")
	assert.True(t, bytes.HasSuffix(all, []byte("bye")), "upstream received %q at the end", all[max(len(all)-8, 0):])
	assert.Equal(t, faultnet.TCPStats{Accepted: 1}, p.Stats())
}

func TestTCPCut(t *testing.T) {
	e := newTCPEcho(t)
	p := startTCP(t, e.ln.Addr().String())
	open := dial(t, p.Addr())
	_, err := roundTrip(open, []byte("x"), patient)
	require.NoError(t, err)

	p.Cut()
	_, err = roundTrip(open, []byte("y"), patient)
	assert.Error(t, err, "an open connection still works after Cut")
	assert.False(t, isTimeout(err), "an open connection hangs after Cut instead of failing: %v", err)

	err = dialRoundTrip(p.Addr(), []byte("z"))
	assert.Error(t, err, "a new connection works while cut")
	assert.False(t, isTimeout(err), "a new connection hangs while cut instead of failing: %v", err)

	p.Heal()
	got, err := roundTrip(dial(t, p.Addr()), []byte("healed"), patient)
	require.NoError(t, err)
	assert.Equal(t, "healed", string(got))
	s := p.Stats()
	assert.Equal(t, int64(1), s.Severed, "%+v", s)
	assert.Equal(t, int64(1), s.Refused, "%+v", s)
	assert.Equal(t, int64(2), s.Accepted, "%+v", s)
}

func TestTCPBlackhole(t *testing.T) {
	e := newTCPEcho(t)
	p := startTCP(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	_, err := roundTrip(c, []byte("before"), patient)
	require.NoError(t, err)

	p.Blackhole()
	_, err = roundTrip(c, []byte("held"), 200*time.Millisecond)
	require.Error(t, err)
	assert.True(t, isTimeout(err), "the black hole answered: %v", err)

	// A connection made during the black hole is held too.
	late := dial(t, p.Addr())
	_, err = late.Write([]byte("late"))
	require.NoError(t, err)

	p.Heal()
	// What was held is delivered: the echo of "held" arrives now.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(patient)))
	got := make([]byte, 4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "held", string(got))
	require.NoError(t, late.SetReadDeadline(time.Now().Add(patient)))
	_, err = io.ReadFull(late, got)
	require.NoError(t, err)
	assert.Equal(t, "late", string(got))
}

func TestTCPSlow(t *testing.T) {
	e := newTCPEcho(t)
	p := startTCP(t, e.ln.Addr().String())
	c := dial(t, p.Addr())

	const latency = 100 * time.Millisecond
	p.Slow(latency)
	began := time.Now()
	got, err := roundTrip(c, []byte("slow"), patient)
	require.NoError(t, err)
	assert.Equal(t, "slow", string(got))
	assert.GreaterOrEqual(t, time.Since(began), 2*latency, "round trip through a link slowed both ways")

	// Heal delivers at once what is waiting.
	p.Slow(time.Hour)
	_, err = c.Write([]byte("long"))
	require.NoError(t, err)
	p.Heal()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(patient)))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "long", string(got))
}

func TestTCPUpstreamUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	p := startTCP(t, addr)
	err = dialRoundTrip(p.Addr(), []byte("x"))
	assert.Error(t, err)
	assert.False(t, isTimeout(err), "hangs instead of failing: %v", err)
	assert.Equal(t, faultnet.TCPStats{Failed: 1}, p.Stats())
}

func TestTCPClose(t *testing.T) {
	e := newTCPEcho(t)
	p, err := faultnet.StartTCP(e.ln.Addr().String())
	require.NoError(t, err)
	c := dial(t, p.Addr())
	_, err = roundTrip(c, []byte("x"), patient)
	require.NoError(t, err)
	p.Blackhole()
	_, err = c.Write([]byte("held when the proxy closes"))
	require.NoError(t, err)

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	assert.NoError(t, waitFor(t, closed, prompt, "return from Close with bytes held"))
	assert.NoError(t, p.Close())
	_, err = roundTrip(c, []byte("y"), patient)
	assert.Error(t, err, "a connection works after Close")
	assert.False(t, isTimeout(err), "a connection hangs after Close: %v", err)
}

// dialRoundTrip connects to addr and makes one round trip. The kernel
// accepts a connection before the proxy can reset it, so the reset reaches
// the client either while it connects or when it reads.
func dialRoundTrip(addr string, msg []byte) error {
	c, err := net.DialTimeout("tcp", addr, patient)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = roundTrip(c, msg, patient)
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// TestTCPOrderAcrossChanges sends a few megabytes through a link that
// keeps changing between healthy, slow and black-holed: every byte arrives,
// once, in order.
func TestTCPOrderAcrossChanges(t *testing.T) {
	e := newTCPEcho(t)
	p := startTCP(t, e.ln.Addr().String())
	c := dial(t, p.Addr())

	stop := make(chan struct{})
	toggled := make(chan struct{})
	go func() {
		defer close(toggled)
		for i := 0; ; i++ {
			switch i % 3 {
			case 0:
				p.Slow(time.Millisecond)
			case 1:
				p.Blackhole()
			case 2:
				p.Heal()
			}
			select {
			case <-stop:
				p.Heal()
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	msg := make([]byte, 4<<20)
	rand.Read(msg)
	got, err := roundTrip(c, msg, patient)
	close(stop)
	<-toggled
	require.NoError(t, err)
	assert.True(t, bytes.Equal(msg, got), "the bytes that came back differ from those sent")
}
