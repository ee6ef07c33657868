package faultnet

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// serveHTTP gives one request its fault and carries it out.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f := p.decide(r)
	var held bool
	if !p.through(r.Context(), &held) {
		p.abort(w, false)
		return
	}
	if f == Reset {
		p.abort(w, true)
		return
	}
	resp, err := p.forward(r)
	if err != nil {
		if !p.through(r.Context(), &held) {
			p.abort(w, false)
			return
		}
		p.fail(w, f, err)
		return
	}
	defer resp.Body.Close()

	var body io.Reader = resp.Body
	switch f {
	case Drop:
		// Read to the end: the upstream has then finished the request.
		_, _ = io.Copy(io.Discard, resp.Body)
		p.through(r.Context(), &held)
		p.abort(w, false)
		return
	case Delay:
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			p.fail(w, f, err)
			return
		}
		if !p.hold(r.Context()) {
			p.abort(w, false)
			return
		}
		body = bytes.NewReader(b)
	}
	if !p.through(r.Context(), &held) {
		p.abort(w, false)
		return
	}
	h := w.Header()
	for k, vv := range resp.Header {
		h[k] = vv
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, body); err != nil {
		// Cut the connection so that the client sees a truncated response
		// rather than a short one that looks complete.
		p.abort(w, false)
	}
}

// fail answers a request that got no response from the upstream.
func (p *Proxy) fail(w http.ResponseWriter, f Fault, err error) {
	if p.ctx.Err() != nil {
		// Close canceled the upstream request: no answer at all, as for
		// every other request that Close interrupts.
		p.abort(w, false)
		return
	}
	p.mu.Lock()
	p.upstreamErrors++
	p.mu.Unlock()
	if f == Drop {
		p.abort(w, false)
		return
	}
	http.Error(w, "faultnet: upstream: "+err.Error(), http.StatusBadGateway)
}

// decide chooses the fault for r and counts it.
func (p *Proxy) decide(r *http.Request) Fault {
	n := p.seq.Add(1)
	f := Pass
	if p.cfg.Decide != nil {
		f = p.cfg.Decide(n, r) // not under p.mu: Decide may call Stats
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Decide == nil {
		c := &p.cfg
		switch u := p.rng.Float64(); {
		case u < c.DropRate:
			f = Drop
		case u < c.DropRate+c.ResetRate:
			f = Reset
		case u < c.DropRate+c.ResetRate+c.DelayRate:
			f = Delay
		}
	}
	if !f.valid() {
		f = Pass
	}
	p.counts[f]++
	return f
}

// forward sends r to the upstream. The upstream request ends when the proxy
// is closed, not when the client goes away: a request that reached the
// upstream runs there to completion, as the faults promise.
func (p *Proxy) forward(r *http.Request) (*http.Response, error) {
	out, err := http.NewRequestWithContext(p.ctx, r.Method, p.base+r.URL.RequestURI(), r.Body)
	if err != nil {
		return nil, err
	}
	out.ContentLength = r.ContentLength
	out.Host = r.Host
	out.Header = r.Header.Clone()
	removeHopHeaders(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // keep the Transport from adding its own
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	removeHopHeaders(resp.Header)
	return resp, nil
}

// removeHopHeaders deletes the headers that describe one connection rather
// than the message (RFC 9110, section 7.6.1), including those that the
// Connection header names.
func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for k := range h {
		switch k {
		case "Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
			delete(h, k)
		default:
			if strings.HasPrefix(k, "Proxy-") {
				delete(h, k)
			}
		}
	}
}

// hold waits for the configured delay. It reports false if the client went
// away or the proxy was closed first.
func (p *Proxy) hold(ctx context.Context) bool {
	t := time.NewTimer(p.cfg.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-p.ctx.Done():
		return false
	}
}

// abort closes the client's connection without (the rest of) a response:
// with a TCP RST if rst is set, else with an ordinary close.
func (p *Proxy) abort(w http.ResponseWriter, rst bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not reached with the proxy's own HTTP/1.1 server; fail loudly
		// rather than pass the request silently.
		http.Error(w, "faultnet: cannot abort connection: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer p.conns.Done() // a hijacked connection never reaches StateClosed
	if tc, ok := conn.(*net.TCPConn); ok && rst {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
