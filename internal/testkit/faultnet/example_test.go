package faultnet_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
)

// A proxy that loses the response to the first request: the server creates
// the order, the client never hears of it, and a naive retry creates a second
// one. This is the failure that idempotency keys exist to prevent.
func ExampleStart() {
	var created atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "order %d created\n", created.Add(1))
	}))
	defer upstream.Close()

	p, err := faultnet.Start(upstream.URL, faultnet.Config{
		Decide: func(n int64, _ *http.Request) faultnet.Fault {
			if n == 1 {
				return faultnet.Drop
			}
			return faultnet.Pass
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for attempt := 1; attempt <= 2; attempt++ {
		resp, err := client.Post(p.URL()+"/orders", "text/plain", strings.NewReader("1 widget"))
		if err != nil {
			fmt.Printf("attempt %d: no response\n", attempt)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("attempt %d: %s, %s", attempt, resp.Status, body)
	}
	fmt.Printf("orders created: %d\n", created.Load())
	fmt.Printf("%+v\n", p.Stats())
	// Output:
	// attempt 1: no response
	// attempt 2: 200 OK, order 2 created
	// orders created: 2
	// {Requests:2 Passed:1 Dropped:1 Reset:0 Delayed:0 UpstreamErrors:0 Blackholed:0}
}

// A TCP proxy in front of a server (here an echo server; in the tests,
// PostgreSQL or Redis): the link works, is cut, and works again.
func ExampleStartTCP() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()

	p, err := faultnet.StartTCP(ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	echo := func(msg string) string {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return "connection failed"
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, msg); err != nil {
			return "connection failed"
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil {
			return "connection failed"
		}
		return string(buf)
	}
	fmt.Println(echo("ping"))
	p.Cut()
	fmt.Println(echo("ping"))
	p.Heal()
	fmt.Println(echo("ping"))
	// Output:
	// ping
	// connection failed
	// ping
}
