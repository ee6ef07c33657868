package idemtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// maxBody bounds how much of an answer's body is read.
const maxBody = 1 << 20

// request is one request a check sends.
type request struct {
	header  http.Header // every header, the key's included
	body    []byte
	variant int
	key     string // the key, unquoted, when hasKey
	value   string // the key header's value, as sent
	hasKey  bool
	// keyText describes the key in reports when it is not plain text.
	keyText string
	// as says who sends it or how, for reports: "as the second caller".
	as string
	// form names the form of a valid key, for reports: "the 64-byte hex
	// key".
	form string
}

// written returns key as the target's key form writes it: quoted for
// "quoted", bare otherwise ("both" sends keys bare but in the key-forms
// check).
func (r *runner) written(key string) string {
	if r.t.Policy.KeyForm == keyQuoted {
		return `"` + key + `"`
	}
	return key
}

// withKey returns the request for variant with the given key, written in
// the target's key form. The kit's keys need no escaping when quoted.
func (r *runner) withKey(variant int, key string) request {
	q := r.withValue(variant, r.written(key))
	q.key = key
	if !utf8.ValidString(key) {
		// Shown escaped, as bodies are.
		q.keyText = quote([]byte(q.value))
	}
	return q
}

// withValue returns the request for variant with the key header set to
// value, as it is.
func (r *runner) withValue(variant int, value string) request {
	q := r.keyless(variant)
	q.header[r.t.KeyHeader] = []string{value}
	q.key, q.value, q.hasKey = value, value, true
	return q
}

// keyless returns the request for variant without a key.
func (r *runner) keyless(variant int) request {
	return request{header: r.t.Header.Clone(), body: r.body[variant], variant: variant}
}

// variantOf returns q with the body of another variant.
func (r *runner) variantOf(q request, variant int) request {
	q.body, q.variant = r.body[variant], variant
	return q
}

// overlay returns q with the entries of h replacing those of the same name.
func overlay(q request, h http.Header, as string) request {
	q.header = q.header.Clone()
	for name, vs := range h {
		q.header[name] = slices.Clone(vs)
	}
	q.as = as
	return q
}

// answer is what came back for a request.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error // no answer, or a broken one
	// at is when the whole answer had come.
	at time.Time
}

func (a answer) ok() bool { return a.err == nil && a.status >= 200 && a.status < 300 }

// same reports whether a and b have the same status and body.
func (a answer) same(b answer) bool {
	return a.err == nil && b.err == nil && a.status == b.status && bytes.Equal(a.body, b.body)
}

// commonReplayHeaders are the spellings of the replay header that servers
// use, recognised besides Target.ReplayedHeader.
var commonReplayHeaders = [...]string{
	"Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotent-Replayed", "X-Idempotency-Replayed",
}

// marker returns the name of the header that marks a as a replay, or ""
// when none does.
func (r *runner) marker(a answer) string {
	if a.err != nil {
		return ""
	}
	for _, name := range r.markers {
		switch v := strings.TrimSpace(a.header.Get(name)); {
		case strings.EqualFold(v, "true"), v == "?1", v == "1":
			return name
		}
	}
	return ""
}

// marked reports whether a carries a replay header, and remembers which.
func (r *runner) marked(a answer) bool {
	name := r.marker(a)
	if name != "" && r.markedWith == "" {
		r.markedWith = name
	}
	return name != ""
}

// send sends q with the client and reads the answer.
func (r *runner) send(q request) answer {
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()
	req, err := r.httpRequest(ctx, q)
	if err != nil {
		return answer{err: err}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		err = fmt.Errorf("reading the body: %w", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body, err: err, at: time.Now()}
}

func (r *runner) httpRequest(ctx context.Context, q request) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, r.t.Method, r.endpoint, bytes.NewReader(q.body))
	if err != nil {
		return nil, err
	}
	// Assigned, not Set: the key goes out exactly as the check wrote it.
	req.Header = q.header.Clone()
	if host := req.Header.Get("Host"); host != "" {
		req.Host = host
		req.Header.Del("Host")
	}
	return req, nil
}

// settle sends q, and sends it again while the answer is 409 (the key in
// flight), for up to Patience. It returns the last answer and how many 409s
// came before it.
func (r *runner) settle(q request) (answer, int) {
	deadline := time.Now().Add(r.t.Patience)
	wait := 20 * time.Millisecond
	conflicts := 0
	for {
		a := r.send(q)
		if a.err != nil || a.status != http.StatusConflict {
			return a, conflicts
		}
		r.keyEffect = true
		left := time.Until(deadline)
		if left <= 0 {
			return a, conflicts
		}
		conflicts++
		t := time.NewTimer(min(wait, left))
		select {
		case <-r.ctx.Done():
			t.Stop()
			return answer{err: r.ctx.Err()}, conflicts
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// dial opens a connection of the kit's own to the target.
func (r *runner) dial(ctx context.Context) (conn net.Conn, tcp *net.TCPConn, err error) {
	d := net.Dialer{Timeout: r.t.Timeout}
	c, err := d.DialContext(ctx, "tcp", r.addr)
	if err != nil {
		return nil, nil, err
	}
	tcp, _ = c.(*net.TCPConn)
	if r.tls == nil {
		return c, tcp, nil
	}
	tc := tls.Client(c, r.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, nil, err
	}
	return tc, tcp, nil
}

// wire returns q as the bytes of an HTTP/1.1 request that asks the target
// to close the connection after its answer, for a connection of the kit's
// own, and the request to read the answer with.
func (r *runner) wire(ctx context.Context, q request) ([]byte, *http.Request, error) {
	req, err := r.httpRequest(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	req.Close = true
	var b bytes.Buffer
	if err := req.Write(&b); err != nil {
		return nil, nil, fmt.Errorf("writing the request: %w", err)
	}
	return b.Bytes(), req, nil
}

// writeRaw writes q on conn, asking the target to close the connection
// after its answer.
func (r *runner) writeRaw(ctx context.Context, conn net.Conn, q request) (*http.Request, error) {
	b, req, err := r.wire(ctx, q)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(b); err != nil {
		return nil, fmt.Errorf("writing the request: %w", err)
	}
	return req, nil
}

func readAnswer(br *bufio.Reader, req *http.Request) answer {
	resp, err := http.ReadResponse(br, req)
	// Interim answers (100 Continue) come before the final one.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(br, req)
	}
	if err != nil {
		return answer{err: fmt.Errorf("reading the answer: %w", err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		err = fmt.Errorf("reading the body: %w", err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body, err: err, at: time.Now()}
}

// errNotAnswered is the answer of a dropped request that the target had not
// answered when the connection was closed.
var errNotAnswered = errors.New("connection closed before an answer came")

// sendDropped sends q on a connection of the kit's own and closes the
// connection DropAfter later, with a reset, as a client whose timeout fires
// then would. It returns the answer if the whole of it came before that, and
// an error wrapping errNotAnswered if it did not: the target then sees the
// client go away while it handles the request, or before it starts.
func (r *runner) sendDropped(q request) answer {
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()
	conn, tcp, err := r.dial(ctx)
	if err != nil {
		return answer{err: err}
	}
	defer func() {
		if tcp != nil {
			tcp.SetLinger(0) // a reset, as from a client that gave up
		}
		conn.Close()
	}()
	conn.SetDeadline(time.Now().Add(r.t.Timeout))
	req, err := r.writeRaw(ctx, conn, q)
	if err != nil {
		return answer{err: err}
	}
	conn.SetReadDeadline(time.Now().Add(r.t.DropAfter))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	a := readAnswer(bufio.NewReader(conn), req)
	if a.err != nil {
		var ne net.Error
		if errors.As(a.err, &ne) && ne.Timeout() {
			return answer{err: fmt.Errorf("%w after %v", errNotAnswered, r.t.DropAfter)}
		}
	}
	return a
}

// describe says what q is, for a report.
func (r *runner) describe(q request) string {
	var b strings.Builder
	b.WriteString(r.display)
	switch {
	case !q.hasKey:
		b.WriteString(" without " + r.t.KeyHeader)
	case q.keyText != "":
		b.WriteString(" with " + r.t.KeyHeader + ": " + q.keyText)
	default:
		b.WriteString(" with " + r.t.KeyHeader + ": " + q.value)
	}
	b.WriteString(", body ")
	b.WriteString(quote(q.body))
	if q.variant != 0 {
		b.WriteString(" (variant " + strconv.Itoa(q.variant) + ")")
	}
	if q.as != "" {
		b.WriteString(", " + q.as)
	}
	return b.String()
}

// describeAnswer says what a is, for a report: the status, the headers that
// the checks compare, the replay header and the body.
func (r *runner) describeAnswer(a answer) string {
	if a.status == 0 {
		if a.err == nil {
			return "no answer"
		}
		return "no answer: " + a.err.Error()
	}
	var b strings.Builder
	b.WriteString(strconv.Itoa(a.status))
	if text := http.StatusText(a.status); text != "" {
		b.WriteString(" " + text)
	}
	for _, name := range [...]string{"Content-Type", "Location"} {
		if v := a.header.Values(name); len(v) > 0 {
			b.WriteString(", " + name + ": " + clip(strings.Join(v, ", ")))
		}
	}
	if name := r.marker(a); name != "" {
		b.WriteString(", " + name + ": " + clip(a.header.Get(name)))
	} else if v := a.header.Get(r.t.ReplayedHeader); v != "" {
		b.WriteString(", " + r.t.ReplayedHeader + ": " + clip(v))
	}
	b.WriteString(", body ")
	b.WriteString(quote(a.body))
	if a.err != nil {
		b.WriteString(" (" + a.err.Error() + ")")
	}
	return b.String()
}

// showLimit is how many bytes of a body or a header value a report shows.
const showLimit = 160

// clip shows a header value in a report, as quote shows a body but without
// the backquotes.
func clip(v string) string {
	text, cut := escape([]byte(v))
	return text + cut
}

// quote shows a body in a report, always in one way, whatever its bytes:
// between backquotes, with a Go escape (\n, \t, \x01) for each control
// character and each byte that is not UTF-8, and cut short if long.
func quote(body []byte) string {
	if len(body) == 0 {
		return "(empty)"
	}
	text, cut := escape(body)
	return "`" + text + "`" + cut
}

// escape returns the first showLimit bytes of b with a Go escape for each
// control character and each byte that is not UTF-8, and, if b is longer,
// a note that says how long.
func escape(b []byte) (text, cut string) {
	shown := b
	if len(b) > showLimit {
		shown = b[:showLimit]
		cut = fmt.Sprintf("... (%d bytes)", len(b))
	}
	var sb strings.Builder
	for len(shown) > 0 {
		c, size := utf8.DecodeRune(shown)
		switch {
		case c == utf8.RuneError && size <= 1:
			if cut != "" && !utf8.FullRune(shown) {
				shown = nil // a character cut in two by the limit
				continue
			}
			fmt.Fprintf(&sb, `\x%02x`, shown[0])
		case c < 0x20 || c == 0x7f:
			q := strconv.QuoteRune(c)
			sb.WriteString(q[1 : len(q)-1])
		default:
			sb.WriteRune(c)
		}
		shown = shown[size:]
	}
	return sb.String(), cut
}
