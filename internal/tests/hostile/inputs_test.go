package hostile_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// maxBody is the middleware's body limit in these tests.
const maxBody = 64 << 10

// target is the middleware on one kind of store, behind a real server.
type target struct {
	addr       string
	executions atomic.Int64
	// stored counts the records the store holds.
	stored func(t *testing.T) int
}

func (tg *target) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	tg.executions.Add(1)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "ran with %d bytes", len(b))
}

// targets returns the middleware on every kind of store, each behind a
// server configured by cfg.
func targets(t *testing.T, cfg func(*http.Server), opts ...server.Option) map[string]*target {
	out := map[string]*target{}
	ctx := context.Background()

	mem := teststores.Memory(t)
	out["memory"] = &target{stored: func(*testing.T) int { return mem.Len() }}

	pool := teststores.PostgresPool(t, 16)
	table := teststores.UniqueName(t, "idempotency_hostile_")
	pg := teststores.PostgresOn(t, pool, table)
	out["postgres"] = &target{stored: func(t *testing.T) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n))
		return n
	}}

	rc := teststores.RedisClient(t)
	prefix := teststores.UniqueName(t, "idempotency-hostile:") + ":"
	rs := teststores.RedisOn(t, rc, prefix)
	out["redis"] = &target{stored: func(t *testing.T) int {
		keys, err := rc.Keys(ctx, prefix+"*").Result()
		require.NoError(t, err)
		return len(keys)
	}}

	for name, s := range map[string]engine.Store{"memory": mem, "postgres": pg, "redis": rs} {
		tg := out[name]
		mw, err := server.New(s, append([]server.Option{server.WithMaxBody(maxBody)}, opts...)...)
		require.NoError(t, err)
		srv := httptest.NewUnstartedServer(mw.Handler(tg))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		if cfg != nil {
			cfg(srv.Config)
		}
		srv.Start()
		t.Cleanup(srv.Close)
		tg.addr = srv.Listener.Addr().String()
	}
	return out
}

// answer is one response read off the connection.
type answer struct {
	status  int
	problem string // the anchor of a problem document's type
	body    string
	echoed  string // the key the server echoed
}

// piece is part of what a client writes: bytes, then a pause.
type piece struct {
	data  string
	pause time.Duration
}

// exchange writes the pieces on a new connection, half-closes it when
// closeWrite is set, and reads up to n answers, stopping early when the
// server closes the connection. Writing and reading run at once, as a
// client's would: a server may answer before it has read everything.
func exchange(t *testing.T, addr string, pieces []piece, closeWrite bool, n int) []answer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for _, p := range pieces {
			if _, err := io.WriteString(c, p.data); err != nil {
				return // the server closed: it has answered, or will not
			}
			if p.pause > 0 {
				time.Sleep(p.pause) // the client's pace, not a wait for a condition
			}
		}
		if closeWrite {
			c.(*net.TCPConn).CloseWrite()
		}
	}()
	defer func() { <-wrote }()
	br := bufio.NewReader(c)
	var out []answer
	for len(out) < n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
				break
			}
			require.NoError(t, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil && !isReset(err) {
			require.NoError(t, err)
		}
		a := answer{status: resp.StatusCode, body: string(b), echoed: resp.Header.Get("Idempotency-Key")}
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			var p struct{ Type string }
			if json.Unmarshal(b, &p) == nil {
				_, a.problem, _ = strings.Cut(p.Type, "#")
			}
		}
		out = append(out, a)
	}
	return out
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// post is a request for /orders with the header lines given (each ending in
// \r\n) and the body.
func post(headers, body string) string {
	return "POST /orders HTTP/1.1\r\nHost: api.example\r\n" + headers + "\r\n" + body
}

func withLength(headers, body string) string {
	return post(headers+fmt.Sprintf("Content-Length: %d\r\n", len(body)), body)
}

// hostileCase is one input, and what must come of it.
type hostileCase struct {
	name       string
	pieces     []piece
	closeWrite bool
	// want is the status of each answer expected, in order; the
	// connection may carry no more.
	want []int
	// problem is the anchor of the first answer's problem type, if it is
	// the middleware's refusal.
	problem string
	// ran and stored are the executions and the records the case makes.
	ran, stored int
}

func one(raw string) []piece { return []piece{{data: raw}} }

func keyCases() []hostileCase {
	key := func(v string) []piece { return one(withLength("Idempotency-Key: "+v+"\r\n", "{}")) }
	return []hostileCase{
		{name: "missing", pieces: one(withLength("", "{}")), want: []int{400}, problem: "ErrMissingKey"},
		{name: "empty", pieces: key(""), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "blank", pieces: key("    "), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "empty quoted", pieces: key(`""`), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "longest", pieces: key(strings.Repeat("k", 255)), want: []int{201}, ran: 1, stored: 1},
		{name: "one byte too long", pieces: key(strings.Repeat("l", 256)), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "8 KiB", pieces: key(strings.Repeat("m", 8<<10)), want: []int{400}, problem: "ErrInvalidKey"},
		// Over net/http's own header limit (1 MiB): refused before the
		// middleware sees it.
		{name: "2 MiB", pieces: key(strings.Repeat("n", 2<<20)), want: []int{431}},
		{name: "high bytes", pieces: key("k\x80\xff\xfe"), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "UTF-8", pieces: key("clé-€"), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "tab inside", pieces: key("a\tb"), want: []int{400}, problem: "ErrInvalidKey"},
		// A NUL, a bare CR or a DEL in a header value is refused by
		// net/http before the middleware sees it.
		{name: "DEL", pieces: key("a\x7fb"), want: []int{400}},
		{name: "NUL", pieces: key("a\x00b"), want: []int{400}},
		{name: "bare CR", pieces: key("a\rb"), want: []int{400}},
		{name: "quoted", pieces: key(`"quoted-1"`), want: []int{201}, ran: 1, stored: 1},
		{name: "quoted with escapes", pieces: key(`"a\"b\\c"`), want: []int{201}, ran: 1, stored: 1},
		{name: "unterminated quote", pieces: key(`"abc`), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "bad escape", pieces: key(`"a\qb"`), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "text after the quote", pieces: key(`"a"b`), want: []int{400}, problem: "ErrInvalidKey"},
		{name: "twice, equal", pieces: one(withLength("Idempotency-Key: twice\r\nIdempotency-Key: twice\r\n", "{}")),
			want: []int{400}, problem: "ErrInvalidKey"},
		{name: "twice, different", pieces: one(withLength("Idempotency-Key: a\r\nIdempotency-Key: b\r\n", "{}")),
			want: []int{400}, problem: "ErrInvalidKey"},
		{name: "twice, in two letter cases", pieces: one(withLength("idempotency-key: c\r\nIDEMPOTENCY-KEY: c\r\n", "{}")),
			want: []int{400}, problem: "ErrInvalidKey"},
		{name: "a hundred times", pieces: one(withLength(strings.Repeat("Idempotency-Key: h\r\n", 100), "{}")),
			want: []int{400}, problem: "ErrInvalidKey"},
	}
}

func bodyCases() []hostileCase {
	n := 0
	key := func() string { n++; return fmt.Sprintf("Idempotency-Key: body-key-%d\r\n", n) }
	huge := strings.Repeat("x", 1<<20)
	chunk := fmt.Sprintf("%x\r\n%s\r\n", 16<<10, strings.Repeat("y", 16<<10))
	return []hostileCase{
		{name: "declared over the limit", pieces: one(post(key()+"Content-Length: 10485760\r\n", huge)),
			want: []int{413}, problem: "ErrBodyTooLarge"},
		{name: "chunked over the limit", pieces: one(post(key()+"Transfer-Encoding: chunked\r\n", strings.Repeat(chunk, 64)+"0\r\n\r\n")),
			want: []int{413}, problem: "ErrBodyTooLarge"},
		{name: "declared over the limit, expecting 100-continue",
			pieces: one(post(key()+"Content-Length: 10485760\r\nExpect: 100-continue\r\n", "")),
			want:   []int{413}, problem: "ErrBodyTooLarge"},
		{name: "shorter than declared", pieces: one(post(key()+"Content-Length: 100\r\n", "0123456789")), closeWrite: true,
			want: []int{400}, problem: "ErrBodyUnreadable"},
		{name: "chunk cut short", pieces: one(post(key()+"Transfer-Encoding: chunked\r\n", "64\r\n0123456789")), closeWrite: true,
			want: []int{400}, problem: "ErrBodyUnreadable"},
		{name: "no last chunk", pieces: one(post(key()+"Transfer-Encoding: chunked\r\n", "a\r\n0123456789\r\n")), closeWrite: true,
			want: []int{400}, problem: "ErrBodyUnreadable"},
		{name: "chunk size not hex", pieces: one(post(key()+"Transfer-Encoding: chunked\r\n", "zz\r\nabc\r\n0\r\n\r\n")),
			want: []int{400}, problem: "ErrBodyUnreadable"},
		{name: "chunk size overflows", pieces: one(post(key()+"Transfer-Encoding: chunked\r\n", "ffffffffffffffffff\r\nabc\r\n0\r\n\r\n")),
			want: []int{400}, problem: "ErrBodyUnreadable"},
		// The rest of the body is read as the next request, which
		// net/http refuses: what was declared is what ran.
		{name: "longer than declared", pieces: one(post(key()+"Content-Length: 2\r\n", "{}GARBAGE / HTTP/1.1\r\n\r\n")),
			want: []int{201, 400}, ran: 1, stored: 1},
		{name: "two lengths", pieces: one(post(key()+"Content-Length: 2\r\nContent-Length: 3\r\n", "{}x")), want: []int{400}},
		{name: "negative length", pieces: one(post(key()+"Content-Length: -1\r\n", "{}")), want: []int{400}},
		// Chunked wins over the length, as RFC 9112 allows.
		{name: "length and chunked", pieces: one(post(key()+"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n")),
			want: []int{201}, ran: 1, stored: 1},
		{name: "unknown transfer coding", pieces: one(post(key()+"Transfer-Encoding: gzip\r\n", "{}")), want: []int{501}},
	}
}

// TestHostileInputs sends every malformed or hostile key and body over a
// real connection to the middleware on each kind of store, and checks the
// answer, that the handler did not run and that nothing was stored (but for
// the controls, which must run once).
func TestHostileInputs(t *testing.T) {
	for name, tg := range targets(t, nil) {
		t.Run(name, func(t *testing.T) {
			for _, group := range []struct {
				name  string
				cases []hostileCase
			}{{"key", keyCases()}, {"body", bodyCases()}} {
				for _, tc := range group.cases {
					t.Run(group.name+"/"+tc.name, func(t *testing.T) {
						ran, stored := tg.executions.Load(), tg.stored(t)
						got := exchange(t, tg.addr, tc.pieces, tc.closeWrite, len(tc.want))
						var statuses []int
						for _, a := range got {
							statuses = append(statuses, a.status)
						}
						t.Logf("answers %v", statuses)
						require.Equal(t, tc.want, statuses, "statuses; bodies %v", got)
						assert.Equal(t, tc.problem, got[0].problem, "problem type of %q", got[0].body)
						assert.Equal(t, int64(tc.ran), tg.executions.Load()-ran, "executions")
						assert.Equal(t, tc.stored, tg.stored(t)-stored, "records stored")
					})
				}
			}
		})
	}
}

// TestQuotedAndBareAreOneKey: the structured-field form and the bare form of
// a key name one record, whichever comes first.
func TestQuotedAndBareAreOneKey(t *testing.T) {
	tg := targets(t, nil)["memory"]
	first := exchange(t, tg.addr, one(withLength("Idempotency-Key: \"same\"\r\n", "{}")), false, 1)
	again := exchange(t, tg.addr, one(withLength("Idempotency-Key: same\r\n", "{}")), false, 1)
	require.Equal(t, 201, first[0].status)
	require.Equal(t, 201, again[0].status)
	assert.Equal(t, first[0].body, again[0].body)
	assert.Equal(t, int64(1), tg.executions.Load())
	assert.Equal(t, `"same"`, first[0].echoed, "the key is echoed as it was sent")
	assert.Equal(t, "same", again[0].echoed)
}

// TestSlowBody: a body that trickles in slower than the server's read
// timeout is refused with 400 once the timeout ends, without running or
// storing anything. The timeout is the server's (http.Server.ReadTimeout):
// the middleware waits for the bytes as long as the connection does, holding
// only what has arrived.
func TestSlowBody(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	for name, tg := range targets(t, func(s *http.Server) { s.ReadTimeout = readTimeout }) {
		t.Run(name, func(t *testing.T) {
			pieces := []piece{{data: post("Idempotency-Key: slow\r\nContent-Length: 100\r\n", "")}}
			for range 20 {
				pieces = append(pieces, piece{data: "x", pause: 50 * time.Millisecond})
			}
			got := exchange(t, tg.addr, pieces, false, 1)
			require.Len(t, got, 1, "an answer")
			assert.Equal(t, 400, got[0].status, "%s", got[0].body)
			assert.Equal(t, "ErrBodyUnreadable", got[0].problem)
			assert.Zero(t, tg.executions.Load(), "executions")
			assert.Zero(t, tg.stored(t), "records stored")
		})
	}
}
