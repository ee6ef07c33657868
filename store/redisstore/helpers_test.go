package redisstore_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testkit/servicetest"
	"github.com/idemkit/idempotency/store/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sharedOptions returns the options of a client of the shared test Redis.
func sharedOptions(t testing.TB) *redis.Options {
	t.Helper()
	opt, err := redis.ParseURL(servicetest.RedisURL(t))
	if err != nil {
		// The URL may hold a password: do not print it.
		t.Fatalf("%s is not a Redis URL", servicetest.EnvRedisURL)
	}
	opt.ContextTimeoutEnabled = true
	return opt
}

// sharedClient returns a client of the shared test Redis, closed when t ends.
func sharedClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(sharedOptions(t))
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a key prefix of its own for t, and deletes the keys
// under it from c when t ends: tests share the Redis with everyone else.
func testPrefix(t testing.TB, c *redis.Client) string {
	t.Helper()
	prefix := "idempotency-test:" + randomHex(t, 8) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Logf("cleaning up %s*: %v", prefix, err)
			return
		}
		for len(keys) > 0 {
			n := min(len(keys), 1000)
			if err := c.Unlink(ctx, keys[:n]...).Err(); err != nil {
				t.Logf("cleaning up %s*: %v", prefix, err)
				return
			}
			keys = keys[n:]
		}
	})
	return prefix
}

// sharedStore returns a Store on the shared test Redis, with keys of its own.
func sharedStore(t testing.TB) (redisstore.Store, *redis.Client) {
	t.Helper()
	c := sharedClient(t)
	s, err := redisstore.New(c, redisstore.WithPrefix(testPrefix(t, c)))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// needRedisServer skips t where redis-server (and the other tools named) is
// not installed, or fails it when services are required: t starts Redis
// servers of its own.
func needRedisServer(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range append([]string{"redis-server"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			msg := fmt.Sprintf("this test starts Redis servers of its own and needs %s: %v; "+
				"install Redis (e.g. apt-get install redis-server) to run it", tool, err)
			if servicetest.Required() {
				t.Fatalf("%s (%s is set, so this is a failure)", msg, servicetest.EnvRequireServices)
			}
			t.Skip(msg)
		}
	}
}

// redisProcess is a redis-server that a test started on a loopback port.
type redisProcess struct {
	Addr   string
	Port   int
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	log    bytes.Buffer
}

// startRedis starts redis-server with args on a free loopback port (and, for
// a Cluster node, a free bus port ten thousand above it), waits until it
// answers PING, and kills it when t ends.
func startRedis(t testing.TB, args ...string) *redisProcess {
	t.Helper()
	var lastErr error
	for range 5 {
		port := servicetest.FreeRedisPort(t)
		p, err := tryStartRedis(t, port, args...)
		if err == nil {
			return p
		}
		lastErr = err
	}
	t.Fatalf("starting redis-server: %v", lastErr)
	return nil
}

func tryStartRedis(t testing.TB, port int, args ...string) (*redisProcess, error) {
	p := &redisProcess{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, exited: make(chan struct{})}
	full := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", t.TempDir(),
	}, args...)
	p.cmd = exec.Command("redis-server", full...)
	p.cmd.Stdout = (*lockedWriter)(p)
	p.cmd.Stderr = (*lockedWriter)(p)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.Kill)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping(p.Addr)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("redis-server on port %d exited: %s", port, p.Log())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("redis-server on port %d does not answer: %v", port, err)
		}
	}
}

type lockedWriter redisProcess

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.Write(b)
}

// Log returns what the server printed.
func (p *redisProcess) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Kill kills the server and waits for it to exit.
func (p *redisProcess) Kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// ping sends PING to addr over a connection of its own, to learn that a
// server is up without a client (and its goroutines).
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	// A server with a password answers NOAUTH: it is up all the same.
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH") {
		return errors.New("PING answered " + strconv.Quote(line))
	}
	return nil
}
