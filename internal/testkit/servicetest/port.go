package servicetest

import (
	"net"
	"strconv"
	"testing"
)

// FreeRedisPort returns a loopback port that is free, and whose Redis
// Cluster bus port (ten thousand above) is free too, at the time of asking:
// the port of a private redis-server a test starts, alone or in a Cluster.
func FreeRedisPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port
	}
	t.Fatal("servicetest: no free pair of loopback ports")
	return 0
}
