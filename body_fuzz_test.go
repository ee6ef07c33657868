package idempotency_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idempotency"
)

// attemptRecorder is a Transport that reads and records the body of each
// attempt, and answers 503 to the first and 201 to the others.
type attemptRecorder struct {
	mu      sync.Mutex
	bodies  [][]byte
	lengths []int64
}

func (r *attemptRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	r.bodies = append(r.bodies, body)
	r.lengths = append(r.lengths, req.ContentLength)
	n := len(r.bodies)
	r.mu.Unlock()
	code := http.StatusCreated
	if n == 1 {
		code = http.StatusServiceUnavailable
	}
	return &http.Response{
		StatusCode: code,
		Header:     http.Header{},
		Body:       http.NoBody,
		Request:    req,
	}, nil
}

// chunkReader hands out its bytes at most n at a time (all of them if n is
// 0), and with the last ones io.EOF if eofWithData.
type chunkReader struct {
	b           []byte
	n           int
	eofWithData bool
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	if r.n > 0 && len(p) > r.n {
		p = p[:r.n]
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	if len(r.b) == 0 && r.eofWithData {
		return n, io.EOF
	}
	return n, nil
}

// FuzzBodyReplay sends arbitrary bodies, with arbitrary ContentLengths and
// buffer limits, through Do to a Transport that fails the first attempt.
// Every attempt must carry the caller's bytes exactly; the request is
// retried if and only if its body could be kept (GetBody, or at most limit
// bytes); a buffered body whose ContentLength is wrong is refused before
// any attempt; the caller's body is always closed.
func FuzzBodyReplay(f *testing.F) {
	f.Add([]byte(`{"amount":10}`), int64(13), int64(1<<20), uint8(0), false)
	f.Add([]byte(`{"amount":10}`), int64(-1), int64(1<<20), uint8(1), false)
	f.Add([]byte(`{"amount":10}`), int64(13), int64(0), uint8(0), true)
	f.Add([]byte(""), int64(0), int64(0), uint8(0), false)
	f.Add([]byte("x"), int64(0), int64(0), uint8(0), false)
	f.Add([]byte("abc"), int64(10), int64(1<<20), uint8(0), false)
	f.Add([]byte("abc"), int64(2), int64(1<<20), uint8(0), false)
	f.Add([]byte(strings.Repeat("x", 16)), int64(16), int64(16), uint8(3), false)
	f.Add([]byte(strings.Repeat("x", 17)), int64(17), int64(16), uint8(3), false)
	f.Add([]byte(strings.Repeat("y", 2000)), int64(-1), int64(-5), uint8(7), false)
	f.Add([]byte("payload"), int64(1<<63-1), int64(1<<63-1), uint8(0), false)
	f.Add([]byte("payload"), int64(1<<40), int64(1<<63-1), uint8(0x81), false)
	f.Add([]byte("payload"), int64(-1<<63), int64(-1<<63), uint8(0x82), false)
	f.Fuzz(func(t *testing.T, body []byte, contentLength, limit int64, mode uint8, withGetBody bool) {
		rec := &attemptRecorder{}
		c, err := idempotency.NewClient(
			idempotency.WithHTTPClient(&http.Client{Transport: rec}),
			idempotency.WithMaxBufferedBody(limit),
			idempotency.WithBackoff(0, 0),
			idempotency.WithBudget(nil),
		)
		if limit < 0 {
			if err == nil {
				t.Fatalf("NewClient with a negative body limit %d error = nil", limit)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		src := &closeTracker{Reader: &chunkReader{b: bytes.Clone(body), n: int(mode & 0x7f), eofWithData: mode&0x80 != 0}}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://api.example/orders", src)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = contentLength
		if withGetBody {
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		}

		resp, err := c.Do(req)
		if !src.closed.Load() {
			t.Error("the caller's body was not closed")
		}
		fits := int64(len(body)) <= max(limit, 0)
		if !withGetBody && fits && contentLength > 0 && contentLength != int64(len(body)) {
			if err == nil || !strings.Contains(err.Error(), "ContentLength") {
				t.Fatalf("Do() error = %v, want one about the ContentLength %d of %d bytes", err, contentLength, len(body))
			}
			if len(rec.bodies) != 0 {
				t.Fatalf("%d attempts sent, want none", len(rec.bodies))
			}
			return
		}
		if err != nil {
			t.Fatalf("Do() error = %v", err)
		}
		resp.Body.Close()
		o, _ := idempotency.OutcomeOf(resp)
		wantAttempts := 2
		if !withGetBody && !fits {
			wantAttempts = 1
			if !errors.Is(o.Stopped, idempotency.ErrBodyNotReplayable) {
				t.Errorf("Outcome.Stopped = %v, want ErrBodyNotReplayable", o.Stopped)
			}
		}
		if o.Attempts != wantAttempts || len(rec.bodies) != wantAttempts {
			t.Fatalf("attempts = %d (%d sent), want %d", o.Attempts, len(rec.bodies), wantAttempts)
		}
		for i, got := range rec.bodies {
			if !bytes.Equal(got, body) {
				t.Fatalf("attempt %d sent %d bytes %q, want the %d bytes %q", i+1, len(got), trim(got), len(body), trim(body))
			}
			if !withGetBody && fits && rec.lengths[i] != int64(len(body)) {
				t.Fatalf("attempt %d ContentLength = %d, want %d", i+1, rec.lengths[i], len(body))
			}
		}
	})
}

func trim(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}
