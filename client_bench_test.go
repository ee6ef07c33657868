package idempotency_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/retryable"
)

// BenchmarkPost measures the happy path, one POST of 1 KiB answered 201
// over a keep-alive loopback connection, for a bare http.Client, this
// package's Client and a stock go-retryablehttp client, all with the same
// Transport settings.
func BenchmarkPost(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 1024)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	newTransport := func(b *testing.B) *http.Transport {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		b.Cleanup(tr.CloseIdleConnections)
		return tr
	}
	ctx := context.Background()
	check := func(b *testing.B, resp *http.Response, err error) {
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("status = %d, want 201", resp.StatusCode)
		}
	}
	newRequest := func(b *testing.B) *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, bytes.NewReader(payload))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		return req
	}

	b.Run("bare", func(b *testing.B) {
		hc := &http.Client{Transport: newTransport(b)}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := hc.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("idempotency", func(b *testing.B) {
		c := clienttest.New(b, idempotency.WithHTTPClient(&http.Client{Transport: newTransport(b)}))
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("idempotency_no_attempt_timeout", func(b *testing.B) {
		c := clienttest.New(b, idempotency.WithHTTPClient(&http.Client{Transport: newTransport(b)}),
			idempotency.WithAttemptTimeout(0))
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("retryablehttp", func(b *testing.B) {
		rc := retryablehttp.NewClient()
		rc.Logger = nil
		rc.HTTPClient = &http.Client{Transport: newTransport(b)}
		b.ReportAllocs()
		for b.Loop() {
			req, err := retryablehttp.FromRequest(newRequest(b))
			if err != nil {
				b.Fatal(err)
			}
			resp, err := rc.Do(req)
			check(b, resp, err)
		}
	})
}

// cannedTransport answers every request with 201 Created without any
// network, so that BenchmarkPostOverhead measures the clients' own cost.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusCreated,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{},
		Body:    http.NoBody,
		Request: req,
	}, nil
}

// BenchmarkPostOverhead is BenchmarkPost without the network: what each
// client adds to a request, free of the noise of loopback I/O.
func BenchmarkPostOverhead(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 1024)
	ctx := context.Background()
	newRequest := func(b *testing.B) *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.example/orders", bytes.NewReader(payload))
		if err != nil {
			b.Fatal(err)
		}
		return req
	}
	check := func(b *testing.B, resp *http.Response, err error) {
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	b.Run("bare", func(b *testing.B) {
		hc := &http.Client{Transport: cannedTransport{}}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := hc.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("bare_key", func(b *testing.B) {
		// What the Client is measured against: a bare client that sets a
		// new key header itself.
		hc := &http.Client{Transport: cannedTransport{}}
		b.ReportAllocs()
		for b.Loop() {
			req := newRequest(b)
			req.Header.Set(hdrKey, idempotency.NewKey())
			resp, err := hc.Do(req)
			check(b, resp, err)
		}
	})
	b.Run("idempotency", func(b *testing.B) {
		c := clienttest.New(b, idempotency.WithHTTPClient(&http.Client{Transport: cannedTransport{}}))
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("idempotency_no_attempt_timeout", func(b *testing.B) {
		c := clienttest.New(b, idempotency.WithHTTPClient(&http.Client{Transport: cannedTransport{}}),
			idempotency.WithAttemptTimeout(0))
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("idempotency_observed", func(b *testing.B) {
		// What an observer costs, one that does nothing with its events.
		c := clienttest.New(b, idempotency.WithHTTPClient(&http.Client{Transport: cannedTransport{}}),
			idempotency.WithObserver(func(context.Context, idempotency.Event) {}))
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Do(newRequest(b))
			check(b, resp, err)
		}
	})
	b.Run("retryablehttp", func(b *testing.B) {
		rc := retryablehttp.NewClient()
		rc.Logger = nil
		rc.HTTPClient = &http.Client{Transport: cannedTransport{}}
		b.ReportAllocs()
		for b.Loop() {
			req, err := retryablehttp.FromRequest(newRequest(b))
			if err != nil {
				b.Fatal(err)
			}
			resp, err := rc.Do(req)
			check(b, resp, err)
		}
	})
}

// BenchmarkPostOverheadRetryable is BenchmarkPostOverhead for a
// go-retryablehttp client before and after retryable.Protect.
func BenchmarkPostOverheadRetryable(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 1024)
	for _, protect := range []bool{false, true} {
		name := "retryablehttp"
		if protect {
			name = "retryablehttp_protected"
		}
		b.Run(name, func(b *testing.B) {
			rc := retryablehttp.NewClient()
			rc.Logger = nil
			rc.HTTPClient = &http.Client{Transport: cannedTransport{}}
			if protect {
				if err := retryable.Protect(rc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				req, err := retryablehttp.NewRequestWithContext(context.Background(), http.MethodPost, "http://api.example/orders", payload)
				if err != nil {
					b.Fatal(err)
				}
				resp, err := rc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}
