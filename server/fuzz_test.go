package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/store/memstore"
)

// fuzzTarget parses target as net/http parses a request line's target, or
// reports that net/http would refuse it.
func fuzzTarget(target string) (*url.URL, bool) {
	u, err := url.ParseRequestURI(target)
	return u, err == nil
}

// FuzzFingerprint: two requests have the same default fingerprint exactly
// when their methods, escaped paths, raw queries and bodies are equal, so
// that no shift of bytes between the parts, and no other part of the request
// (host, headers), makes two different requests one, or one request two.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", []byte(`{"sku":"A"}`), "POST", "/orders", []byte(`{"sku":"B"}`))
	f.Add("POST", "/orders?x=1", []byte{}, "POST", "/orders?x=2", []byte{})
	f.Add("POST", "/a%2Fb", []byte("x"), "POST", "/a/b", []byte("x"))
	f.Add("PO", "/ST/x", []byte("x"), "POST", "//x", []byte("x"))
	f.Add("POST", "/x?", []byte("x"), "POST", "/x", []byte("x"))
	f.Add("POST", "/aA", []byte(nil), "POST", "/a%41", []byte(nil))
	f.Add("PATCH", "/x", []byte("1:a"), "PATCH", "/x1", []byte(":a"))
	f.Fuzz(func(t *testing.T, m1, t1 string, b1 []byte, m2, t2 string, b2 []byte) {
		u1, ok1 := fuzzTarget(t1)
		u2, ok2 := fuzzTarget(t2)
		if !ok1 || !ok2 {
			t.Skip("net/http refuses the request line")
		}
		r1 := &http.Request{Method: m1, URL: u1, Host: "a.example", Header: http.Header{"X-A": {"1"}}}
		r2 := &http.Request{Method: m2, URL: u2, Host: "b.example", Header: http.Header{"Authorization": {"x"}}}
		fp1, err := server.Fingerprint(r1, b1)
		if err != nil {
			t.Fatalf("Fingerprint(%q %q) error = %v", m1, t1, err)
		}
		again, _ := server.Fingerprint(r1, bytes.Clone(b1))
		if again != fp1 {
			t.Fatalf("Fingerprint(%q %q) is not deterministic", m1, t1)
		}
		fp2, err := server.Fingerprint(r2, b2)
		if err != nil {
			t.Fatalf("Fingerprint(%q %q) error = %v", m2, t2, err)
		}
		same := m1 == m2 && u1.EscapedPath() == u2.EscapedPath() && u1.RawQuery == u2.RawQuery && bytes.Equal(b1, b2)
		if got := fp1 == fp2; got != same {
			t.Fatalf("Fingerprint(%q %q %q) == Fingerprint(%q %q %q) is %v, want %v (escaped paths %q, %q)",
				m1, t1, b1, m2, t2, b2, got, same, u1.EscapedPath(), u2.EscapedPath())
		}
	})
}

// fuzzRequest builds the request that net/http would parse from a request
// line, header lines and a body, as a server reads it off a connection. When
// the header lines frame no body (no Content-Length, no Transfer-Encoding),
// the body's own length is declared; lines that do frame it may lie.
func fuzzRequest(method, target, header string, body []byte, auth string) (*http.Request, bool) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: api.example\r\n", method, target)
	framed := false
	for line := range strings.SplitSeq(header, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		name, _, _ := strings.Cut(line, ":")
		switch http.CanonicalHeaderKey(strings.TrimSpace(name)) {
		case "Content-Length", "Transfer-Encoding":
			framed = true
		case "Authorization":
			continue // the scope is the test's to choose
		}
		b.WriteString(line)
		b.WriteString("\r\n")
	}
	if !framed {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	fmt.Fprintf(&b, "Authorization: %s\r\n\r\n", auth)
	b.Write(body)
	r, err := http.ReadRequest(bufio.NewReader(&b))
	if err != nil {
		return nil, false
	}
	return r, true
}

// fuzzHandler answers every request it runs with 201 and a body that names
// the caller, the request body's length and the execution.
type fuzzHandler struct{ executions atomic.Int64 }

func (h *fuzzHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// A protected request's body is one the middleware has read
		// whole: a failure to read it is the middleware's.
		w.WriteHeader(http.StatusTeapot)
		return
	}
	n := h.executions.Add(1)
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "caller=%s execution=%d length=%d", r.Header.Get("Authorization"), n, len(body))
}

// fuzzAnswer is one request served through the middleware.
type fuzzAnswer struct {
	status      int
	contentType string
	body        string
	replayed    bool
	echoed      bool // the key came back: the request was protected, its key valid
	ran         bool
}

func fuzzServe(h http.Handler, ex *fuzzHandler, r *http.Request) fuzzAnswer {
	before := ex.executions.Load()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return fuzzAnswer{
		status:      w.Code,
		contentType: w.Header().Get("Content-Type"),
		body:        w.Body.String(),
		replayed:    w.Header().Get("Idempotent-Replayed") == "true",
		echoed:      len(w.Header().Values("Idempotency-Key")) > 0,
		ran:         ex.executions.Load() != before,
	}
}

// FuzzMiddleware serves a request whose method, target, headers and body come
// from the fuzzer, as net/http parses them, through the middleware on a fresh
// memstore: first for one caller, then for another, then for the first again,
// then with another body. It never panics, never answers 5xx itself, never
// replays one caller's response to another, replays a stored response only
// for the same request, and refuses a key reused with another body.
func FuzzMiddleware(f *testing.F) {
	f.Add("POST", "/orders", "Idempotency-Key: k1\nContent-Type: application/json", []byte(`{"sku":"A"}`), []byte(`{"sku":"B"}`))
	f.Add("POST", "/orders", `Idempotency-Key: "k\"1"`, []byte("x"), []byte("x"))
	f.Add("PATCH", "/o/1?x=y", "Idempotency-Key: k\nIdempotency-Key: k", []byte("x"), []byte("y"))
	f.Add("POST", "/", "", []byte("x"), []byte("y"))
	f.Add("GET", "/", "Idempotency-Key: k", []byte{}, []byte("y"))
	f.Add("POST", "/", "Idempotency-Key: k\nTransfer-Encoding: chunked", []byte("3\r\nabc\r\n0\r\n\r\n"), []byte("z"))
	f.Add("POST", "/", "Idempotency-Key: k\nContent-Length: 10", []byte("abc"), []byte("abc"))
	f.Fuzz(func(t *testing.T, method, target, header string, body, body2 []byte) {
		store, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		mw, err := server.New(store)
		if err != nil {
			t.Fatal(err)
		}
		ex := &fuzzHandler{}
		h := mw.Handler(ex)
		serve := func(auth string, body []byte) (fuzzAnswer, bool) {
			r, ok := fuzzRequest(method, target, header, body, auth)
			if !ok {
				return fuzzAnswer{}, false
			}
			a := fuzzServe(h, ex, r)
			if a.status >= 500 {
				t.Fatalf("%s %q with headers %q: status %d from the middleware: %s", method, target, header, a.status, a.body)
			}
			if a.status == http.StatusTeapot {
				if a.echoed {
					t.Fatalf("%s %q with headers %q: the handler could not read the body the middleware read for it", method, target, header)
				}
				// An unprotected request's body reaches the handler
				// untouched, unreadable or not.
				return a, true
			}
			if a.status != http.StatusCreated && a.contentType != "application/problem+json" {
				t.Fatalf("%s %q with headers %q: refusal %d is %q, want a problem document", method, target, header, a.status, a.contentType)
			}
			if a.contentType == "application/problem+json" {
				var p struct{ Code string }
				if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.Code == "" {
					t.Fatalf("%s %q with headers %q: problem %q has no code (%v)", method, target, header, a.body, err)
				}
			}
			if a.status == http.StatusCreated && !a.replayed && !strings.HasPrefix(a.body, "caller="+auth+" ") {
				t.Fatalf("caller %s got an original answer for another: %q", auth, a.body)
			}
			return a, true
		}
		first, ok := serve("Bearer alice", body)
		if !ok {
			t.Skip("net/http refuses the request")
		}
		other, _ := serve("Bearer bob", body)
		if other.replayed || other.status == http.StatusConflict || other.status == http.StatusUnprocessableEntity {
			t.Fatalf("another caller's request with the same key got %d (replayed %v) %q after %d %q",
				other.status, other.replayed, other.body, first.status, first.body)
		}
		if other.status != first.status {
			t.Fatalf("the same request from another caller got %d, the first %d: %q, %q", other.status, first.status, other.body, first.body)
		}

		stored := first.ran && first.echoed && first.status == http.StatusCreated
		again, _ := serve("Bearer alice", body)
		switch {
		case stored && (!again.replayed || again.ran || again.status != first.status || again.body != first.body):
			t.Fatalf("the same request again got %d %q (replayed %v, ran %v), want the replay of %d %q",
				again.status, again.body, again.replayed, again.ran, first.status, first.body)
		case !stored && again.replayed:
			t.Fatalf("a request whose first answer %d was not stored got a replay %d %q", first.status, again.status, again.body)
		}

		if !stored || bytes.Equal(body, body2) || strings.Contains(strings.ToLower(header), "content-length") ||
			strings.Contains(strings.ToLower(header), "transfer-encoding") {
			return
		}
		changed, ok := serve("Bearer alice", body2)
		if ok && changed.status != http.StatusUnprocessableEntity && changed.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("the key reused with body %q instead of %q got %d %q (replayed %v), want 422",
				body2, body, changed.status, changed.body, changed.replayed)
		}
	})
}
