package exampleapp

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serve answers on the listener until its context is done, then returns nil
// and closes the listener.
func TestServeStopsWhenContextIsDone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello")
		}))
	}()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "hello", string(body))

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err, "serve() after its context is done")
	case <-time.After(10 * time.Second):
		t.Fatal("serve() did not return after its context was done")
	}
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "the listener still accepts connections")
}

// serve returns the error of a listener that fails.
func TestServeReturnsServeError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln.Close()
	err = serve(t.Context(), ln, http.NotFoundHandler())
	assert.Error(t, err, "serve() on a closed listener")
}
