package main

import (
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRun(t *testing.T) {
	u := os.Getenv("IDEMPOTENCY_NATS_URL")
	if u == "" {
		u = "nats://127.0.0.1:4222"
	}
	if p, err := url.Parse(u); err == nil {
		c, err := net.DialTimeout("tcp", p.Host, 2*time.Second)
		if err != nil {
			servicetest.Unavailable(t, "NATS", err)
		}
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	sum, err := runSummary(ctx, &out, config{url: u, orders: 3, ackWait: 300 * time.Millisecond})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := (summary{published: 3, deliveries: 4, charges: 3, replays: 1}); sum != want {
		t.Errorf("run() = %+v, want %+v", sum, want)
	}
	for _, want := range []string{"duplicate=true", "lost the ack of order-2", "replayed order-2 (delivery 2)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
