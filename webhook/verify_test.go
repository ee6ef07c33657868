package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	stripewebhook "github.com/stripe/stripe-go/v82/webhook"

	"github.com/idemkit/idempotency/webhook"
)

// Secrets as the senders issue them. None is real.
const (
	standardSecret      = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	standardOtherSecret = "whsec_dGhpcyBpcyBhbm90aGVyIHNlY3JldCBrZXk="
	stripeSecret        = "whsec_test_secret_for_the_corpus"
	stripeOtherSecret   = "whsec_another_test_secret"
)

var payload = []byte(`{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"invoice.paid","data":{"object":{"id":"in_1","amount_paid":2000}}}`)

// verdict is whether a verifier accepts a delivery.
func verdict(err error) string {
	if err == nil {
		return "accept"
	}
	return "refuse"
}

// request builds a delivery with headers h and body.
func request(h http.Header, body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(string(body)))
	for k, vs := range h {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	return r
}

// standardCase is one delivery of the Standard Webhooks corpus.
type standardCase struct {
	name    string
	want    string // "accept" or "refuse"
	headers http.Header
	body    []byte
}

// standardCorpus signs deliveries with the Standard Webhooks Go library,
// and spoils some of them.
func standardCorpus(t *testing.T, now time.Time) []standardCase {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(standardSecret)
	require.NoError(t, err)
	other, err := standardwebhooks.NewWebhook(standardOtherSecret)
	require.NoError(t, err)
	sign := func(wh *standardwebhooks.Webhook, id string, at time.Time, body []byte) string {
		sig, err := wh.Sign(id, at, body)
		require.NoError(t, err)
		return sig
	}
	hdr := func(id string, at time.Time, sig string) http.Header {
		h := http.Header{}
		h.Set(standardwebhooks.HeaderWebhookID, id)
		h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
		h.Set(standardwebhooks.HeaderWebhookSignature, sig)
		return h
	}
	id := "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
	good := sign(wh, id, now, payload)
	tampered := append([]byte(nil), payload...)
	tampered[len(tampered)-3] = '9'
	svix := http.Header{}
	svix.Set("svix-id", id)
	svix.Set("svix-timestamp", strconv.FormatInt(now.Unix(), 10))
	svix.Set("svix-signature", good)
	return []standardCase{
		{"signed", "accept", hdr(id, now, good), payload},
		{"signed one minute ago", "accept", hdr(id, now.Add(-time.Minute), sign(wh, id, now.Add(-time.Minute), payload)), payload},
		{"tampered body", "refuse", hdr(id, now, good), tampered},
		{"another id", "refuse", hdr("msg_other", now, good), payload},
		{"stale timestamp", "refuse", hdr(id, now.Add(-10*time.Minute), sign(wh, id, now.Add(-10*time.Minute), payload)), payload},
		{"future timestamp", "refuse", hdr(id, now.Add(10*time.Minute), sign(wh, id, now.Add(10*time.Minute), payload)), payload},
		{"timestamp changed", "refuse", hdr(id, now.Add(-time.Second), good), payload},
		{"wrong secret", "refuse", hdr(id, now, sign(other, id, now, payload)), payload},
		{"rotation: old and new", "accept", hdr(id, now, sign(other, id, now, payload)+" "+good), payload},
		{"rotation: new and old", "accept", hdr(id, now, good+" "+sign(other, id, now, payload)), payload},
		{"v1a only", "refuse", hdr(id, now, "v1a,"+strings.TrimPrefix(good, "v1,")), payload},
		{"no signature header", "refuse", http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {strconv.FormatInt(now.Unix(), 10)}}, payload},
		{"timestamp not a number", "refuse", http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {"soon"}, "Webhook-Signature": {good}}, payload},
		{"empty body signed", "accept", hdr(id, now, sign(wh, id, now, nil)), nil},
		{"svix headers", "accept", svix, payload},
	}
}

// TestStandardWebhooksAgreesWithLibrary: on deliveries signed by the
// Standard Webhooks Go library, the preset accepts and refuses exactly what
// the library's own Verify does.
func TestStandardWebhooksAgreesWithLibrary(t *testing.T) {
	now := time.Now()
	wh, err := standardwebhooks.NewWebhook(standardSecret)
	require.NoError(t, err)
	sender := webhook.StandardWebhooks(standardSecret)
	for _, c := range standardCorpus(t, now) {
		t.Run(c.name, func(t *testing.T) {
			libHeaders := c.headers
			if c.headers.Get("svix-id") != "" {
				// The library reads only webhook-* names: give it the
				// same values under them.
				libHeaders = http.Header{}
				libHeaders.Set("webhook-id", c.headers.Get("svix-id"))
				libHeaders.Set("webhook-timestamp", c.headers.Get("svix-timestamp"))
				libHeaders.Set("webhook-signature", c.headers.Get("svix-signature"))
			}
			lib := wh.Verify(c.body, libHeaders)
			ours := sender.Verify(request(c.headers, c.body), c.body, now)
			assert.Equal(t, c.want, verdict(lib), "library: %v", lib)
			assert.Equal(t, c.want, verdict(ours), "preset: %v", ours)
			if ours != nil {
				assert.True(t, errors.Is(ours, webhook.ErrMalformed) || errors.Is(ours, webhook.ErrUnverified), "error %v wraps neither sentinel", ours)
			}
		})
	}
}

// stripeCase is one delivery of the Stripe corpus.
type stripeCase struct {
	name   string
	want   string
	header string
	body   []byte
}

// stripeCorpus signs deliveries with stripe-go's test signing helper, and
// spoils some of them.
func stripeCorpus(now time.Time) []stripeCase {
	sign := func(secret string, at time.Time, body []byte) string {
		return stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: at}).Header
	}
	v1 := func(secret string, at time.Time, body []byte) string {
		return "v1=" + hex.EncodeToString(stripewebhook.ComputeSignature(at, body, secret))
	}
	tampered := []byte(strings.Replace(string(payload), "2000", "2001", 1))
	ts := "t=" + strconv.FormatInt(now.Unix(), 10)
	return []stripeCase{
		{"signed", "accept", sign(stripeSecret, now, payload), payload},
		{"signed four minutes ago", "accept", sign(stripeSecret, now.Add(-4*time.Minute), payload), payload},
		{"signed in the future", "accept", sign(stripeSecret, now.Add(10*time.Minute), payload), payload},
		{"tampered body", "refuse", sign(stripeSecret, now, payload), tampered},
		{"stale timestamp", "refuse", sign(stripeSecret, now.Add(-6*time.Minute), payload), payload},
		{"wrong secret", "refuse", sign(stripeOtherSecret, now, payload), payload},
		{"timestamp changed", "refuse", ts + "," + strings.SplitN(sign(stripeSecret, now.Add(-time.Second), payload), ",", 2)[1], payload},
		{"rolled secret: old first", "accept", ts + "," + v1(stripeOtherSecret, now, payload) + "," + v1(stripeSecret, now, payload), payload},
		{"rolled secret with v0", "accept", ts + "," + v1(stripeSecret, now, payload) + ",v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39", payload},
		{"v0 only", "refuse", ts + ",v0=" + strings.TrimPrefix(v1(stripeSecret, now, payload), "v1="), payload},
		{"no header", "refuse", "", payload},
		{"broken pair", "refuse", ts + ",v1", payload},
		{"timestamp not a number", "refuse", "t=soon," + v1(stripeSecret, now, payload), payload},
		{"no timestamp", "refuse", v1(stripeSecret, now, payload), payload},
	}
}

// TestStripeAgreesWithStripeGo: on deliveries signed by stripe-go's
// webhook.GenerateTestSignedPayload, the preset accepts and refuses exactly
// what stripe-go's webhook.ValidatePayload does.
func TestStripeAgreesWithStripeGo(t *testing.T) {
	now := time.Now()
	sender := webhook.Stripe(stripeSecret)
	for _, c := range stripeCorpus(now) {
		t.Run(c.name, func(t *testing.T) {
			lib := stripewebhook.ValidatePayload(c.body, c.header, stripeSecret)
			h := http.Header{}
			if c.header != "" {
				h.Set("Stripe-Signature", c.header)
			}
			ours := sender.Verify(request(h, c.body), c.body, now)
			assert.Equal(t, c.want, verdict(lib), "stripe-go: %v", lib)
			assert.Equal(t, c.want, verdict(ours), "preset: %v", ours)
		})
	}
	id, err := sender.ID(request(nil, payload), payload)
	require.NoError(t, err)
	assert.Equal(t, "evt_1NG8Du2eZvKYlo2CUI79vXWy", id)
	_, err = sender.ID(request(nil, []byte(`{"object":"event"}`)), []byte(`{"object":"event"}`))
	assert.ErrorIs(t, err, webhook.ErrMalformed)
}

// TestGitHubDocumentedVector: the example of GitHub's "Validating webhook
// deliveries" (secret "It's a Secret to Everybody", payload "Hello, World!")
// is accepted, and spoiled copies of it refused.
func TestGitHubDocumentedVector(t *testing.T) {
	const sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	body := []byte("Hello, World!")
	sender := webhook.GitHub("It's a Secret to Everybody")
	cases := []struct {
		name, want, sig string
		body            []byte
		secret          string
	}{
		{"documented", "accept", sig, body, ""},
		{"second secret", "accept", sig, body, "rotated"},
		{"tampered body", "refuse", sig, []byte("Hello, World?"), ""},
		{"wrong secret", "refuse", sig, body, "only"},
		{"sha1 form", "refuse", "sha1=" + strings.TrimPrefix(sig, "sha256="), body, ""},
		{"no header", "refuse", "", body, ""},
		{"not hex", "refuse", "sha256=zz", body, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := sender
			switch c.secret {
			case "rotated":
				s = webhook.GitHub("new secret", "It's a Secret to Everybody")
			case "only":
				s = webhook.GitHub("another secret")
			}
			h := http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}}
			if c.sig != "" {
				h.Set("X-Hub-Signature-256", c.sig)
			}
			err := s.Verify(request(h, c.body), c.body, time.Now())
			assert.Equal(t, c.want, verdict(err), "%v", err)
		})
	}
}

// TestShopifyAndGitLab: a body signed as Shopify documents (base64
// HMAC-SHA256 with the client secret) and a GitLab token are accepted; a
// tampered body, a wrong secret or token, a missing header refused.
func TestShopifyAndGitLab(t *testing.T) {
	body := []byte(`{"id":820982911946154508,"email":"jon@example.com"}`)
	mac := func(secret string, b []byte) string {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(b)
		return base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	shop := webhook.Shopify("shpss_client_secret")
	lab := webhook.GitLab("gitlab-token")
	cases := []struct {
		name, want string
		s          webhook.Sender
		h          http.Header
		body       []byte
	}{
		{"shopify signed", "accept", shop, http.Header{"X-Shopify-Hmac-Sha256": {mac("shpss_client_secret", body)}}, body},
		{"shopify tampered", "refuse", shop, http.Header{"X-Shopify-Hmac-Sha256": {mac("shpss_client_secret", body)}}, append([]byte(" "), body...)},
		{"shopify wrong secret", "refuse", shop, http.Header{"X-Shopify-Hmac-Sha256": {mac("another", body)}}, body},
		{"shopify unsigned", "refuse", shop, http.Header{}, body},
		{"gitlab token", "accept", lab, http.Header{"X-Gitlab-Token": {"gitlab-token"}}, body},
		{"gitlab second token", "accept", webhook.GitLab("new-token", "gitlab-token"), http.Header{"X-Gitlab-Token": {"gitlab-token"}}, body},
		{"gitlab wrong token", "refuse", lab, http.Header{"X-Gitlab-Token": {"gitlab-tokem"}}, body},
		{"gitlab token prefix", "refuse", lab, http.Header{"X-Gitlab-Token": {"gitlab"}}, body},
		{"gitlab no token", "refuse", lab, http.Header{}, body},
		{"gitlab two tokens", "refuse", lab, http.Header{"X-Gitlab-Token": {"gitlab-token", "gitlab-token"}}, body},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.s.Verify(request(c.h, c.body), c.body, time.Now())
			assert.Equal(t, c.want, verdict(err), "%v", err)
		})
	}
}

// TestPresetIDs: each preset finds the delivery id where its sender puts
// it, and refuses a delivery without one.
func TestPresetIDs(t *testing.T) {
	cases := []struct {
		s      webhook.Sender
		header string
	}{
		{webhook.StandardWebhooks(standardSecret), "webhook-id"},
		{webhook.GitHub("s"), "X-GitHub-Delivery"},
		{webhook.Shopify("s"), "X-Shopify-Event-Id"},
		{webhook.GitLab("s"), "Idempotency-Key"},
	}
	for _, c := range cases {
		t.Run(c.s.Name, func(t *testing.T) {
			id, err := c.s.ID(request(http.Header{c.header: {"delivery-1"}}, nil), nil)
			require.NoError(t, err)
			assert.Equal(t, "delivery-1", id)
			_, err = c.s.ID(request(http.Header{}, nil), nil)
			assert.ErrorIs(t, err, webhook.ErrMalformed)
			_, err = c.s.ID(request(http.Header{c.header: {strings.Repeat("x", 256)}}, nil), nil)
			assert.ErrorIs(t, err, webhook.ErrMalformed)
		})
	}
}

// TestPresetTTLs: every preset keeps its records at least as long as its
// sender retries (the figures of the presets' documentation), and waits
// less than the sender's deadline.
func TestPresetTTLs(t *testing.T) {
	cases := []struct {
		s                 webhook.Sender
		retries, deadline time.Duration
	}{
		{webhook.StandardWebhooks(standardSecret), 75*time.Hour + 35*time.Minute + 5*time.Second, 15 * time.Second},
		{webhook.Stripe("s"), 72 * time.Hour, 10 * time.Second},
		{webhook.GitHub("s"), 72 * time.Hour, 10 * time.Second},
		{webhook.Shopify("s"), 4 * time.Hour, 5 * time.Second},
		{webhook.GitLab("s"), 72 * time.Hour, 10 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.s.Name, func(t *testing.T) {
			assert.GreaterOrEqual(t, c.s.TTL, c.retries, fmt.Sprintf("TTL %v shorter than the retries", c.s.TTL))
			assert.Less(t, c.s.Wait, c.deadline)
			assert.Positive(t, c.s.Wait)
		})
	}
}
