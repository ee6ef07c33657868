package redisstore_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/store/redisstore"
)

// libraries returns the names of the function libraries that c's server
// holds.
func libraries(t *testing.T, c redis.Cmdable) []string {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	return names
}

// A server that lost the functions (flushed, or restarted without
// persistence) gets them again from the first call that finds it without
// them, in that call, which succeeds.
func TestFunctionsReloaded(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	admin := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { admin.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil { // connect before counting
		t.Fatal(err)
	}
	counter := &commandCounter{}
	c.AddHook(counter)
	reloaded := []string{"fcall", "function", "fcall"}

	id := engine.ID{Key: "order-1"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || cl.Status != engine.Acquired {
		t.Fatalf("first Claim = %v, %v; want acquired", cl.Status, err)
	}
	if got := counter.take(); !slices.Equal(got, reloaded) {
		t.Errorf("first Claim on a new server sent %q, want %q", got, reloaded)
	}
	libs := libraries(t, admin)
	if len(libs) != 1 || !strings.HasPrefix(libs[0], "idempotency_") {
		t.Fatalf("server holds libraries %q, want one idempotency_ library", libs)
	}

	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusCreated}, time.Hour); err != nil {
		t.Fatalf("Complete after FUNCTION FLUSH error = %v", err)
	}
	if got := counter.take(); !slices.Equal(got, reloaded) {
		t.Errorf("Complete after FUNCTION FLUSH sent %q, want %q", got, reloaded)
	}
	if got := libraries(t, admin); !slices.Equal(got, libs) {
		t.Errorf("after FUNCTION FLUSH and a call, server holds %q, want %q", got, libs)
	}
	if cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour); err != nil || cl.Status != engine.Completed {
		t.Errorf("Claim after Complete = %v, %v; want completed", cl.Status, err)
	}
	if got := counter.take(); !slices.Equal(got, []string{"fcall"}) {
		t.Errorf("Claim with the functions loaded sent %q, want one FCALL", got)
	}

	// A restart without persistence forgets records and functions alike.
	p.Kill()
	_, err = tryStartRedis(t, p.Port)
	if err != nil {
		t.Fatalf("restarting redis-server on port %d: %v", p.Port, err)
	}
	cl, err = s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || cl.Status != engine.Acquired {
		t.Fatalf("Claim after a restart = %v, %v; want acquired", cl.Status, err)
	}
	if err := s.Release(ctx, id, cl.Token); err != nil {
		t.Fatalf("Release after a restart error = %v", err)
	}
}

// A failover to a server that holds the records but not the functions, as a
// replica promoted without them: the next call loads them there, and the
// lease taken on the old master is completed on the new one.
func TestFailoverToServerWithoutFunctions(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	ctx := context.Background()
	oldMaster, newMaster := startRedis(t), startRedis(t)
	var addr atomic.Value
	addr.Store(oldMaster.Addr)
	c := redis.NewClient(&redis.Options{
		ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr.Load().(string))
		},
	})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	id := engine.ID{Scope: "tenant", Key: "order-7"}
	cl, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
	if err != nil || cl.Status != engine.Acquired {
		t.Fatalf("Claim = %v, %v; want acquired", cl.Status, err)
	}

	// The new master has the record, as a replica would, and no functions.
	old := redis.NewClient(&redis.Options{Addr: oldMaster.Addr})
	defer old.Close()
	dump, err := old.Dump(ctx, s.RecordKey(id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	replica := redis.NewClient(&redis.Options{Addr: newMaster.Addr})
	defer replica.Close()
	if err := replica.Restore(ctx, s.RecordKey(id), time.Hour, dump).Err(); err != nil {
		t.Fatal(err)
	}
	if libs := libraries(t, replica); len(libs) != 0 {
		t.Fatalf("new master holds libraries %q, want none", libs)
	}
	addr.Store(newMaster.Addr)
	oldMaster.Kill()

	if err := s.Complete(ctx, id, cl.Token, &engine.Response{Status: http.StatusCreated, Body: []byte("7")}, time.Hour); err != nil {
		t.Fatalf("Complete after the failover error = %v", err)
	}
	got, err := s.Claim(ctx, id, "other", time.Minute, time.Hour)
	if err != nil || got.Status != engine.Completed || got.Fingerprint != "fp" || string(got.Response.Body) != "7" {
		t.Fatalf("Claim after the failover = %+v, %v; want the completed response", got, err)
	}
	if libs := libraries(t, replica); len(libs) != 1 {
		t.Errorf("new master holds libraries %q, want the store's", libs)
	}
}

// Stores of one release share one library, whatever their prefix.
func TestOneLibraryPerRelease(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	for i := range 3 {
		s, err := redisstore.New(c, redisstore.WithPrefix("api-"+strconv.Itoa(i)+":"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claim(ctx, engine.ID{Key: "k"}, "fp", time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if libs := libraries(t, c); len(libs) != 1 {
		t.Errorf("server holds libraries %q, want one", libs)
	}
}

// A server that cannot hold the functions (an older Redis, or a user not
// allowed FUNCTION LOAD) fails every call as a store error, and does not
// loop.
func TestFunctionsRefused(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { admin.Close() })
	if err := admin.Do(ctx, "ACL", "SETUSER", "api", "on", ">pw", "~*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr, Username: "api", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(ctx).Err(); err != nil { // connect before counting
		t.Fatal(err)
	}
	counter := &commandCounter{}
	c.AddHook(counter)
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Claim(ctx, engine.ID{Key: "k"}, "fp", time.Minute, time.Hour)
	if err == nil || errors.Is(err, engine.ErrLeaseLost) || !strings.HasPrefix(err.Error(), "redisstore: claim: ") {
		t.Errorf("Claim without FUNCTION LOAD rights error = %v, want a store error", err)
	}
	if got := counter.take(); !slices.Equal(got, []string{"fcall", "function"}) {
		t.Errorf("Claim sent %q, want one FCALL and one FUNCTION LOAD", got)
	}
}

// Many calls that find a new server without the library at once all load it
// and succeed; the server ends with one library.
func TestConcurrentFirstCalls(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	p := startRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, PoolSize: 32})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	const callers = 32
	start := make(chan struct{})
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			cl, err := s.Claim(ctx, engine.ID{Key: strconv.Itoa(i)}, "fp", time.Minute, time.Hour)
			if err == nil && cl.Status != engine.Acquired {
				err = errors.New("status " + cl.Status.String())
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Claim on a server without the library error = %v", err)
		}
	}
	if libs := libraries(t, c); len(libs) != 1 {
		t.Errorf("server holds libraries %q, want one", libs)
	}
}
