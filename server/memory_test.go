package server_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/server"
)

// readSignal is a request body that reports each Read as it begins.
type readSignal struct {
	io.ReadCloser
	reads chan<- struct{}
}

func (r *readSignal) Read(p []byte) (int, error) {
	r.reads <- struct{}{}
	return r.ReadCloser.Read(p)
}

// TestDeclaredLengthNotReserved: connections that declare a large body and
// send one byte hold memory for what they sent, not for what they declared.
func TestDeclaredLengthNotReserved(t *testing.T) {
	const conns = 24
	const declared = 1 << 20
	reads := make(chan struct{}, 1000)
	mw, err := server.New(newMem(t), server.WithMaxBody(declared))
	require.NoError(t, err)
	var ran atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) }))
	srv := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &readSignal{ReadCloser: r.Body, reads: reads}
		h.ServeHTTP(w, r)
	}))

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range conns {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		open = append(open, c)
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k%d\r\nContent-Length: %d\r\n\r\nx", i, declared)
	}
	// Each request reads its one byte, then blocks in its second Read.
	for range 2 * conns {
		<-reads
	}
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	held := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d connections declaring %d bytes hold %d bytes of heap", conns, declared, held)
	assert.Less(t, held, int64(conns*declared/4), "the declared lengths were reserved")
	assert.Zero(t, ran.Load())
}

// TestBodyLimitStillHolds: growing the buffer as bytes arrive keeps the limit,
// whether the length is declared or not.
func TestBodyLimitStillHolds(t *testing.T) {
	for _, size := range []int{0, 1, 99, 100, 101, 40_000, 70_000} {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d chunked=%v", size, chunked), func(t *testing.T) {
				var got atomic.Value
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, _ := io.ReadAll(r.Body)
					got.Store(string(b))
					w.WriteHeader(http.StatusCreated)
				})
				limit := int64(100)
				if size > 1000 {
					limit = 64 << 10
				}
				srv, _ := fixture(t, h, server.WithMaxBody(limit))
				body := strings.Repeat("b", size)
				var r io.Reader = strings.NewReader(body)
				if chunked {
					r = io.MultiReader(r) // hides the length
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL, r)
				req.Header.Set("Idempotency-Key", "k")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				if int64(size) > limit {
					assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
					return
				}
				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, body, got.Load())
			})
		}
	}
}
