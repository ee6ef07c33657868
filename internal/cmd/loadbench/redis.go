package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/cmd/benchreport"
	"github.com/idemkit/idempotency/store/redisstore"
)

// redisBench runs redisstore. By default it starts a redis-server of its
// own, so that the server's CPU time and command counts are this run's
// alone; with an external server (-redis-url) it counts only what the
// client sees.
type redisBench struct {
	replayKey string
	prefix    string
	own       *redisProcess // nil on an external server
	client    *redis.Client
	admin     *redis.Client
	store     redisstore.Store
	h         http.Handler
	wire      *wire
	cpu       *procCPU
	prefilled int
	version   string
}

func newRedisBench(ctx context.Context, replayKey string, poolSize int, url string) (*redisBench, error) {
	r := &redisBench{replayKey: replayKey, wire: &wire{}, cpu: newProcCPU()}
	if url == "" {
		p, err := startRedis()
		if err != nil {
			return nil, err
		}
		r.own = p
		r.cpu.add(p.cmd.Process.Pid)
		url = "redis://" + p.addr + "/0"
		r.prefix = "loadbench:"
	} else {
		r.prefix = "idempotency-loadbench-" + randomHex(4) + ":"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		r.close()
		// The URL may hold a password: do not print it.
		return nil, errors.New("loadbench: the Redis URL is not valid")
	}
	adminOpt := *opt
	r.admin = redis.NewClient(&adminOpt)
	opt.PoolSize = poolSize
	opt.Dialer = r.wire.dial
	r.client = redis.NewClient(opt)
	if r.store, err = redisstore.New(r.client, redisstore.WithPrefix(r.prefix)); err == nil {
		r.h, err = newMiddleware(r.store)
	}
	if err == nil {
		err = seedReplay(r.h, replayKey)
	}
	if err == nil {
		err = r.warm(ctx, poolSize)
	}
	if err == nil {
		var info string
		info, err = r.admin.Info(ctx, "server").Result()
		r.version = infoField(info, "redis_version")
	}
	if err != nil {
		r.close()
		return nil, fmt.Errorf("loadbench: redis: %w", err)
	}
	return r, nil
}

// warm opens the pool's connections now, so that no phase pays for them.
func (r *redisBench) warm(ctx context.Context, n int) error {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- r.client.Do(ctx, "PING").Err() }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (r *redisBench) name() string { return benchreport.Redis }

// recordKey returns the Redis key of key's record, in the scope of a
// request without credentials.
func (r *redisBench) recordKey(key string) string { return r.store.RecordKey(engine.ID{Key: key}) }

// copyRecords stores copies of the replayed key's record under the keys
// prefill-(from) to prefill-(to), expiring after ttl (after the template's
// own time to live if ttl is 0).
func (r *redisBench) copyRecords(ctx context.Context, from, to int, ttl time.Duration) error {
	tmpl := r.recordKey(r.replayKey)
	rec, err := r.admin.Get(ctx, tmpl).Result()
	if err != nil {
		return err
	}
	if ttl == 0 {
		if ttl, err = r.admin.PTTL(ctx, tmpl).Result(); err != nil {
			return err
		}
	}
	const batch = 1000
	for lo := from; lo <= to; lo += batch {
		pipe := r.admin.Pipeline()
		for i := lo; i <= min(to, lo+batch-1); i++ {
			pipe.Set(ctx, r.recordKey(prefillKey(i)), rec, ttl)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// unlink removes the records of keys name(1) to name(n).
func (r *redisBench) unlink(ctx context.Context, n int64, name func(i int64) string) error {
	const batch = 1000
	for lo := int64(1); lo <= n; lo += batch {
		keys := make([]string, 0, batch)
		for i := lo; i <= min(n, lo+batch-1); i++ {
			keys = append(keys, r.recordKey(name(i)))
		}
		if err := r.admin.Unlink(ctx, keys...).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (r *redisBench) usedMemory(ctx context.Context) (int64, error) {
	info, err := r.admin.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(infoField(info, "used_memory"), 10, 64)
}

func (r *redisBench) fill(ctx context.Context, n int) ([]benchreport.SizeItem, error) {
	if n < r.prefilled {
		if err := r.unlink(ctx, int64(r.prefilled), func(i int64) string { return prefillKey(int(i)) }); err != nil {
			return nil, err
		}
		r.prefilled = 0
	}
	before, err := r.usedMemory(ctx)
	if err != nil {
		return nil, err
	}
	added := n - r.prefilled
	if added > 0 {
		if err := r.copyRecords(ctx, r.prefilled+1, n, 0); err != nil {
			return nil, err
		}
		r.prefilled = n
	}
	if added < 10_000 || r.own == nil {
		return nil, nil // too few to weigh, or a server that others use
	}
	after, err := r.usedMemory(ctx)
	if err != nil {
		return nil, err
	}
	return []benchreport.SizeItem{{What: "used_memory", BytesPerRecord: float64(after-before) / float64(added)}}, nil
}

func (r *redisBench) beforePhase(context.Context) error { return nil }

func (r *redisBench) afterPhase(ctx context.Context, kind, prefix string, keys int64) error {
	if kind != benchreport.KindFirst {
		return nil
	}
	if err := r.unlink(ctx, keys, func(i int64) string { return prefix + "-" + strconv.FormatInt(i, 10) }); err != nil {
		return fmt.Errorf("loadbench: redis: removing a phase's records: %w", err)
	}
	return nil
}

func (r *redisBench) handler() http.Handler { return r.h }

func (r *redisBench) meters() meters {
	m := meters{
		cpu:   func() (time.Duration, bool) { return 0, false },
		wire:  r.wire,
		calls: func(context.Context) (int64, bool) { return 0, false },
	}
	if r.own != nil {
		m.cpu = r.cpu.total
		m.calls = r.fcalls
	}
	return m
}

// fcalls returns how many function calls the server ran, from INFO
// commandstats. A claim of a new key or of a completed one is a plain
// SET, not a function call: a first execution makes one (the completion),
// a replay none.
func (r *redisBench) fcalls(ctx context.Context) (int64, bool) {
	info, err := r.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, false
	}
	var n int64
	for _, name := range []string{"cmdstat_fcall", "cmdstat_fcall_ro"} {
		line := infoField(info, name)
		calls, _, _ := strings.Cut(strings.TrimPrefix(line, "calls="), ",")
		if c, err := strconv.ParseInt(calls, 10, 64); err == nil {
			n += c
		}
	}
	return n, true
}

func (r *redisBench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r.admin != nil && r.own == nil {
		// An external server: remove this run's keys.
		iter := r.admin.Scan(ctx, 0, r.prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			if keys = append(keys, iter.Val()); len(keys) == 1000 {
				r.admin.Unlink(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			r.admin.Unlink(ctx, keys...)
		}
	}
	if r.client != nil {
		r.client.Close()
	}
	if r.admin != nil {
		r.admin.Close()
	}
	if r.own != nil {
		r.own.stop()
	}
}

// infoField returns the value of name in an INFO reply.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// redisProcess is a redis-server that this program started.
type redisProcess struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
}

// startRedis starts redis-server on a free loopback port, without
// persistence, refusing writes rather than evicting at its memory bound.
func startRedis() (*redisProcess, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("loadbench: no redis-server to start (or use -redis-url): %w", err)
	}
	var lastErr error
	for range 5 {
		p, err := tryStartRedis(bin)
		if err == nil {
			return p, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("loadbench: starting redis-server: %w", lastErr)
}

func tryStartRedis(bin string) (*redisProcess, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	p := &redisProcess{addr: "127.0.0.1:" + strconv.Itoa(port), exited: make(chan struct{})}
	// Without persistence the server writes no file: the temporary
	// directory is only where it starts.
	p.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", os.TempDir(),
		"--maxmemory-policy", "noeviction", "--logfile", "")
	p.cmd.SysProcAttr = childAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("redis-server on port %d does not answer: %w", port, err)
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("redis-server on port %d exited", port)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop kills the server and waits for it.
func (p *redisProcess) stop() {
	p.cmd.Process.Kill()
	<-p.exited
}
