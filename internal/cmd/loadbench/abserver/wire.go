package main

import (
	"context"
	"net"
	"sync/atomic"
	"time"
)

// wire counts what a store client does on its connections. Both clients
// (pgx, go-redis) write a request whole, in one Write, and read its answer
// before the next: each Write is a round trip, a preparation of a
// statement, a ping or a reconnection included.
type wire struct {
	writes, sent, received atomic.Int64
}

// wireCount is a reading of a wire's counters.
type wireCount struct{ writes, bytes int64 }

func (w *wire) read() wireCount {
	return wireCount{w.writes.Load(), w.sent.Load() + w.received.Load()}
}

// dial dials TCP and counts what goes over the connection.
func (w *wire) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, w: w}, nil
}

type countedConn struct {
	net.Conn
	w *wire
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.w.writes.Add(1)
	n, err := c.Conn.Write(p)
	c.w.sent.Add(int64(n))
	return n, err
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.w.received.Add(int64(n))
	return n, err
}
