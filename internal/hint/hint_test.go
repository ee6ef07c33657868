package hint_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/hint"
	"github.com/idemkit/idempotency/internal/wire"
)

func response(status int, contentType string, body io.ReadCloser) *http.Response {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	return &http.Response{StatusCode: status, Header: h, Body: body}
}

func TestRead(t *testing.T) {
	doc := func(members string) io.ReadCloser { return io.NopCloser(strings.NewReader("{" + members + "}")) }
	tests := []struct {
		name   string
		resp   *http.Response
		want   hint.Answer
		bodyIs string
	}{
		{"in flight", response(409, "application/problem+json", doc(`"type":"`+wire.TypeInFlight+`"`)), hint.InFlight, ""},
		{"in flight, json with parameters", response(409, "application/json; charset=utf-8", doc(`"code":"in_flight"`)), hint.InFlight, ""},
		{"the draft's title, another case", response(409, "application/problem+json", doc(`"title":"a request is outstanding for this idempotency-key"`)), hint.InFlight, ""},
		{"outcome unknown wins", response(409, "application/problem+json", doc(`"type":"`+wire.TypeOutcomeUnknown+`","code":"in_flight"`)), hint.OutcomeUnknown, ""},
		{"mismatch", response(422, "application/problem+json", doc(`"type":"`+wire.TypeKeyMismatch+`"`)), hint.KeyMismatch, ""},
		{"mismatch type on a 409", response(409, "application/problem+json", doc(`"type":"`+wire.TypeKeyMismatch+`"`)), hint.None, ""},
		{"in-flight type on a 422", response(422, "application/problem+json", doc(`"type":"`+wire.TypeInFlight+`"`)), hint.None, ""},
		{"not JSON", response(409, "text/plain", doc(`"code":"in_flight"`)), hint.None, ""},
		{"broken JSON", response(409, "application/problem+json", io.NopCloser(strings.NewReader(`{"code":`))), hint.None, `{"code":`},
		{"another status", response(503, "application/problem+json", doc(`"code":"in_flight"`)), hint.None, ""},
		{"no body", response(409, "application/problem+json", http.NoBody), hint.None, ""},
		{"too large to read", response(409, "application/problem+json",
			io.NopCloser(strings.NewReader(`{"code":"in_flight","detail":"`+strings.Repeat("x", hint.MaxProblem)+`"}`))), hint.None, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want string
			if tt.resp.Body != http.NoBody {
				b, err := io.ReadAll(tt.resp.Body)
				require.NoError(t, err)
				want = string(b)
				tt.resp.Body = io.NopCloser(strings.NewReader(want))
			}
			assert.Equal(t, tt.want, hint.Read(tt.resp, time.Second), "Read()")
			assert.Equal(t, tt.want, hint.Read(tt.resp, time.Second), "Read() again")
			if tt.resp.StatusCode == 409 || tt.resp.StatusCode == 422 {
				assert.Equal(t, tt.want, hint.Of(tt.resp), "Of()")
			}
			got, err := io.ReadAll(tt.resp.Body)
			require.NoError(t, err)
			assert.Equal(t, want, string(got), "the body, whole")
			assert.NoError(t, tt.resp.Body.Close())
		})
	}
}

// stalled is a body that gives its first bytes, then blocks until closed.
type stalled struct {
	first  string
	closed chan struct{}
}

func (s *stalled) Read(p []byte) (int, error) {
	if s.first != "" {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	<-s.closed
	return 0, io.ErrUnexpectedEOF
}

func (s *stalled) Close() error {
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	return nil
}

// TestReadStalled: a body that stalls is read for no longer than the
// bound, and its reader gets what was read, then the error.
func TestReadStalled(t *testing.T) {
	body := &stalled{first: `{"code":"in_fl`, closed: make(chan struct{})}
	resp := response(409, "application/problem+json", body)
	assert.Equal(t, hint.None, hint.Read(resp, 20*time.Millisecond))
	got, err := io.ReadAll(resp.Body)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, `{"code":"in_fl`, string(got))
}

func TestShouldRetry(t *testing.T) {
	tests := []struct {
		header    http.Header
		allow, ok bool
	}{
		{http.Header{}, false, false},
		{http.Header{"Stripe-Should-Retry": {"true"}}, true, true},
		{http.Header{"Stripe-Should-Retry": {" FALSE "}}, false, true},
		{http.Header{"X-Should-Retry": {"true"}}, true, true},
		{http.Header{"X-Should-Retry": {"true"}, "Stripe-Should-Retry": {"false"}}, false, true},
		{http.Header{"X-Should-Retry": {"false"}, "Stripe-Should-Retry": {"true"}}, false, true},
		{http.Header{"X-Should-Retry": {"maybe"}}, false, false},
	}
	for _, tt := range tests {
		allow, ok := hint.ShouldRetry(tt.header)
		assert.Equal(t, tt.allow, allow, "ShouldRetry(%v) allow", tt.header)
		assert.Equal(t, tt.ok, ok, "ShouldRetry(%v) ok", tt.header)
	}
}
