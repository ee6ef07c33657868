package storetest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/memstore"
	"github.com/idemkit/idempotency/server/storetest"
)

func TestMemstore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) server.Store {
		s, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// brokenStores are deliberately wrong Stores, each with the subtests of the
// suite that must catch it.
var brokenStores = map[string]struct {
	store    func(*memstore.Store) server.Store
	mustFail []string
}{
	"ignores-tokens": {
		store:    func(m *memstore.Store) server.Store { return ignoresTokens{m} },
		mustFail: []string{"StaleTokenRefused", "LeaseExpiryAndTakeover"},
	},
	"check-then-insert": {
		store:    func(m *memstore.Store) server.Store { return &checkThenInsert{Store: m, held: map[server.ID]bool{}} },
		mustFail: []string{"ConcurrentClaimers"},
	},
	"text-only": {
		store:    func(m *memstore.Store) server.Store { return textOnly{m} },
		mustFail: []string{"BinaryRoundTrip", "LargeBody"},
	},
}

// TestSuiteCatchesBrokenStores runs the suite, in a child process, against
// each broken store, and checks that the subtests meant to catch it fail.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in child processes")
	}
	for name, b := range brokenStores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStore$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "STORETEST_BROKEN="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("suite passed against the %s store, want failures:\n%s", name, out)
			}
			for _, sub := range b.mustFail {
				if !bytes.Contains(out, []byte("--- FAIL: TestBrokenStore/"+sub+" ")) {
					t.Errorf("subtest %s did not fail against the %s store; output:\n%s", sub, name, out)
				}
			}
		})
	}
}

// TestBrokenStore is the child process of TestSuiteCatchesBrokenStores; it
// does nothing in a normal run.
func TestBrokenStore(t *testing.T) {
	name := os.Getenv("STORETEST_BROKEN")
	if name == "" {
		return
	}
	storetest.Run(t, func(t *testing.T) server.Store {
		m, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return brokenStores[name].store(m)
	})
}

// ignoresTokens completes, releases and extends whatever the token.
type ignoresTokens struct{ *memstore.Store }

func (s ignoresTokens) Complete(ctx context.Context, id server.ID, _ server.Token, resp *server.Response, ttl time.Duration) error {
	c, err := s.Store.Claim(ctx, id, "", time.Nanosecond, ttl)
	if err != nil {
		return err
	}
	if c.Status == server.Acquired {
		return s.Store.Complete(ctx, id, c.Token, resp, ttl)
	}
	return nil
}

func (s ignoresTokens) Release(context.Context, server.ID, server.Token) error { return nil }

func (s ignoresTokens) Extend(context.Context, server.ID, server.Token, time.Duration) error {
	return nil
}

// checkThenInsert looks for a record, then creates one: two claimers can
// both see none.
type checkThenInsert struct {
	*memstore.Store
	mu   sync.Mutex
	held map[server.ID]bool
}

func (s *checkThenInsert) Claim(ctx context.Context, id server.ID, fp string, lease, ttl time.Duration) (server.Claim, error) {
	s.mu.Lock()
	seen := s.held[id]
	s.mu.Unlock()
	if seen {
		return s.Store.Claim(ctx, id, fp, lease, ttl)
	}
	runtime.Gosched()
	s.mu.Lock()
	s.held[id] = true
	s.mu.Unlock()
	c, err := s.Store.Claim(ctx, id, fp, lease, ttl)
	if err == nil && c.Status == server.InFlight {
		c = server.Claim{Status: server.Acquired, Token: 1}
	}
	return c, err
}

// textOnly stores bodies and headers as valid UTF-8 text, as a store that
// used a text column would.
type textOnly struct{ *memstore.Store }

func (s textOnly) Complete(ctx context.Context, id server.ID, tok server.Token, resp *server.Response, ttl time.Duration) error {
	r := *resp
	r.Body = []byte(strings.ToValidUTF8(string(resp.Body), "?"))
	r.Header = resp.Header.Clone()
	for k, vs := range r.Header {
		for i, v := range vs {
			r.Header[k][i] = strings.ToValidUTF8(v, "?")
		}
	}
	return s.Store.Complete(ctx, id, tok, &r, ttl)
}
