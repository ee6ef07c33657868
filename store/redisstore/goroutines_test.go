package redisstore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// callerConn is a connection that records the commands written on it from
// a goroutine whose stack does not hold caller: those that a goroutine
// other than the caller's sent. A Dialer in the client's options makes it,
// so it sees what a clone of the client sends too, which a hook does not.
type callerConn struct {
	net.Conn
	w *callerWrites
}

type callerWrites struct {
	caller []byte
	mu     sync.Mutex
	sent   int
	away   []string
}

func (c callerConn) Write(p []byte) (int, error) {
	// A command is an array of bulk strings: *n CRLF $len CRLF name CRLF ...
	if parts := bytes.SplitN(p, []byte("\r\n"), 4); len(parts) == 4 {
		name := strings.ToLower(string(parts[2]))
		if name == "fcall" || name == "set" {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			c.w.mu.Lock()
			c.w.sent++
			if !bytes.Contains(buf, c.w.caller) {
				c.w.away = append(c.w.away, name)
			}
			c.w.mu.Unlock()
		}
	}
	return c.Conn.Write(p)
}

// A call with a deadline runs on its caller's goroutine, whatever the
// client and its timeouts: the Store starts no goroutine per call on a
// *redis.Client, a Ring or a Cluster client, with ContextTimeoutEnabled or
// without (but for the first call through a Cluster client without it,
// which may read the slot map).
func TestNoGoroutinePerCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  func(*redis.Options)
	}{
		{"ContextTimeoutEnabled", func(o *redis.Options) {}},
		{"without ContextTimeoutEnabled", func(o *redis.Options) { o.ContextTimeoutEnabled = false }},
		{"without it, no timeouts", func(o *redis.Options) {
			o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout = false, -2, -2
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opt := sharedOptions(t)
			tc.opt(opt)
			w := &callerWrites{caller: []byte("TestNoGoroutinePerCall")}
			opt.Dialer = w.dialer()
			c := redis.NewClient(opt)
			t.Cleanup(func() { c.Close() })
			callsOnCaller(t, c, w, 0)
		})
	}
	for _, timeouts := range []time.Duration{0, -2} {
		t.Run(fmt.Sprintf("Ring without ContextTimeoutEnabled, timeouts %v", timeouts), func(t *testing.T) {
			t.Parallel()
			opt := sharedOptions(t)
			w := &callerWrites{caller: []byte("TestNoGoroutinePerCall")}
			ring := redis.NewRing(&redis.RingOptions{
				Addrs:    map[string]string{"one": opt.Addr},
				Username: opt.Username, Password: opt.Password, DB: opt.DB,
				ReadTimeout: timeouts, WriteTimeout: timeouts,
				Dialer: w.dialer(),
			})
			t.Cleanup(func() { ring.Close() })
			callsOnCaller(t, ring, w, 0)
		})
	}
	t.Run("Cluster without ContextTimeoutEnabled", func(t *testing.T) {
		t.Parallel()
		addrs := startCluster(t)
		w := &callerWrites{caller: []byte("TestNoGoroutinePerCall")}
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: w.dialer()})
		t.Cleanup(func() { c.Close() })
		// The first call goes through the Cluster client, on a goroutine
		// of its own, since the client has not read the slot map yet.
		callsOnCaller(t, c, w, 1)
	})
}

// dialer returns a Dialer whose connections record in w, or nil (go-redis's
// own) when w is nil.
func (w *callerWrites) dialer() func(context.Context, string, string) (net.Conn, error) {
	if w == nil {
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return callerConn{conn, w}, nil
	}
}

// callsOnCaller claims, extends, releases, completes and replays keys
// through a Store on c, whose connections record in w, and checks that
// every SET and FCALL but the first away was sent from the test's
// goroutine. Keys on every master of a Cluster: 32 of them, each through
// the function's path, then the command's.
func callsOnCaller(t *testing.T, c redis.UniversalClient, w *callerWrites, away int) {
	t.Helper()
	s, err := redisstore.New(c, redisstore.WithPrefix(testPrefix(t, sharedClient(t))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 32 {
		id := engine.ID{Scope: "s", Key: fmt.Sprint("k", i)}
		for range 2 { // the function's path, then the command's
			cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil || cl.Status != engine.Acquired {
				t.Fatalf("Claim = %v, %v; want acquired", cl.Status, err)
			}
			if err := s.Extend(ctx, id, cl.Token, time.Minute); err != nil {
				t.Fatalf("Extend error = %v", err)
			}
			if err := s.Release(ctx, id, cl.Token); err != nil {
				t.Fatalf("Release error = %v", err)
			}
			id.Key += "-next"
		}
		cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		if err != nil || cl.Status != engine.Acquired {
			t.Fatalf("Claim = %v, %v; want acquired", cl.Status, err)
		}
		if err := s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusOK}, time.Hour); err != nil {
			t.Fatalf("Complete error = %v", err)
		}
		if cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour); err != nil || cl.Status != engine.Completed {
			t.Fatalf("Claim = %v, %v; want completed", cl.Status, err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sent < 8*32 || len(w.away) > away {
		t.Errorf("of %d commands, %d were sent from a goroutine other than the caller's (the first: %q), want %d at most",
			w.sent, len(w.away), w.away[:min(len(w.away), 4)], away)
	}
}

// A Cluster client without ContextTimeoutEnabled reads the slot map at its
// first call, by its own timeouts: when the node it asks hangs, the Store's
// first call still fails by its deadline, and so does the next.
func TestClusterHungBeforeSlotMap(t *testing.T) {
	t.Parallel()
	addr := fakeRedis(t, func([]string) string { return "" }) // answers nothing
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ReadTimeout: -2, WriteTimeout: -2})
	t.Cleanup(func() { c.Close() })
	// WithReplicaAck calls the master on its own (replicas.go): it too
	// must not ask the client for the key's master before the map is read.
	for _, opts := range [][]redisstore.Option{nil, {redisstore.WithReplicaAck(1, time.Second)}} {
		s, err := redisstore.New(c, opts...)
		if err != nil {
			t.Fatal(err)
		}
		claimsEndByDeadline(t, s, fmt.Sprintf("%d options", len(opts)))
	}
}

// claimsEndByDeadline makes two claims through s, each with a deadline of
// 200 ms, and checks that each fails with context.DeadlineExceeded at
// about that deadline.
func claimsEndByDeadline(t *testing.T, s redisstore.Store, label string) {
	t.Helper()
	for i := range 2 {
		const deadline = 200 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		_, err := s.Claim(ctx, engine.ID{Key: fmt.Sprint("k", i)}, "fp", time.Minute, time.Hour)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s, call %d: Claim error = %v, want context.DeadlineExceeded", label, i, err)
		}
		if took > deadline+500*time.Millisecond {
			t.Errorf("%s, call %d: Claim took %v, want about its deadline, %v", label, i, took, deadline)
		}
	}
}

// fakeRedis serves RESP on a loopback port: answer gives the reply to each
// command (its words), "" to answer nothing, ever, or closeConn to close
// the connection without an answer. It returns its
// address; its connections close when t ends.
func fakeRedis(t *testing.T, answer func(words []string) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { serveFake(conn, answer) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, conn := range conns {
			conn.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// deafRingOn returns a Store on a Ring without ContextTimeoutEnabled or any
// timeout, whose one shard is a fakeRedis that answers a command named in
// answers (upper case) as it says, HELLO as a Redis that speaks RESP2 only,
// PING, and any other command with OK.
func deafRingOn(t *testing.T, answers map[string]string) redisstore.Store {
	t.Helper()
	addr := fakeRedis(t, func(words []string) string {
		name := strings.ToUpper(words[0])
		if reply, ok := answers[name]; ok {
			return reply
		}
		switch name {
		case "HELLO":
			return "-ERR unknown command 'HELLO'\r\n"
		case "PING":
			return "+PONG\r\n"
		}
		return "+OK\r\n"
	})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": addr}, ReadTimeout: -2, WriteTimeout: -2})
	t.Cleanup(func() { ring.Close() })
	s, err := redisstore.New(ring)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// closeConn is the answer of fakeRedis's answer function that closes the
// connection.
const closeConn = "\x00close"

// serveFake reads commands (RESP arrays of bulk strings) from conn and
// writes answer's replies, until conn fails or a command is not answered.
func serveFake(conn net.Conn, answer func(words []string) string) {
	r := bufio.NewReader(conn)
	line := func() string {
		l, err := r.ReadString('\n')
		if err != nil {
			return ""
		}
		return strings.TrimRight(l, "\r\n")
	}
	for {
		head := line()
		if !strings.HasPrefix(head, "*") {
			return
		}
		n, err := strconv.Atoi(head[1:])
		if err != nil {
			return
		}
		words := make([]string, n)
		for i := range words {
			size, err := strconv.Atoi(strings.TrimPrefix(line(), "$"))
			if err != nil {
				return
			}
			buf := make([]byte, size+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return
			}
			words[i] = string(buf[:size])
		}
		reply := answer(words)
		switch reply {
		case "":
			return // and the connection stays open, unanswered
		case closeConn:
			conn.Close()
			return
		}
		if _, err := conn.Write([]byte(reply)); err != nil {
			return
		}
	}
}

// A server that answers a call with "Function not found" and then hangs on
// FUNCTION LOAD: through a Ring without ContextTimeoutEnabled or any
// timeout, the Store loads the library through the shard's own client, and
// the Claim still fails by its deadline.
func TestLoadHangs(t *testing.T) {
	t.Parallel()
	s := deafRingOn(t, map[string]string{
		"FCALL":    "-ERR Function not found\r\n",
		"FUNCTION": "",
	})
	claimsEndByDeadline(t, s, "Ring")
}

// A completion of a record larger than 1 MiB whose connection the server
// closes (as Redis does on an argument above its proto-max-bulk-len), on a
// server that then hangs on CONFIG GET: through a Ring without
// ContextTimeoutEnabled or any timeout, the Store reads the limit through
// the shard's own client, and the Complete still fails by its deadline.
func TestBulkLimitHangs(t *testing.T) {
	t.Parallel()
	s := deafRingOn(t, map[string]string{
		"FCALL":  closeConn,
		"CONFIG": "",
	})
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := s.Complete(ctx, engine.ID{Key: "k"}, 1, &engine.Response{Status: 200, Body: make([]byte, 2<<20)}, time.Hour)
	took := time.Since(start)
	if err == nil || errors.Is(err, engine.ErrNotStorable) {
		t.Errorf("Complete error = %v, want the failure, not one of size", err)
	}
	if took > deadline+500*time.Millisecond {
		t.Errorf("Complete took %v, want about its deadline, %v", took, deadline)
	}
}
